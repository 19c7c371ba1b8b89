"""The facts the VM rig's pool-module guest must show (scripts/vm_poolmod_guest.sh, issue 58): the
nearlocal_pool module built against the guest kernel's own headers and loaded on the nvdimm's
range once device-dax let it go; the pool's load, store, nt-store and clflush-load rows at 16 KiB
with attr uc and wc, each `info.memtype` read back from PAT as asked; its refusals (a range
device-dax holds, System RAM, a size of 0) each one kernel-log line and the run naming the missing
device one line, exit 2; bad input one line, exit 2; a write-back mapping held elsewhere refusing uc
(naming PAT) and rmmod; after the stage no module, no claimed range, no PAT entry. Types and
protocol only: TCG has no cache timing, so no figure here is a speed.

    python scripts/vm_poolmod.py OUT   (exit 1 naming every fact that does not hold)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from vm_facts import _rows

METHODS = ("load", "store", "nt-store", "clflush-load")
REGION = "ncmem:/dev/nearlocal-pool0"
PAT_NAMES = {"uc": "uncached", "wc": "write-combining", "wb": "write-back"}


def _text(path: Path) -> str:
    return path.read_text(errors="replace").strip() if path.exists() else "missing"


def _one_line_exit_2(out: Path, name: str, needle: str) -> tuple[bool, str]:
    """A run that must end with one line on stderr and exit 2, the line holding `needle`."""
    rc, err = _text(out / f"{name}.rc"), _text(out / f"{name}.err")
    ok = rc == "2" and len(err.splitlines()) == 1 and needle in err
    return ok, f"rc {rc}: {err[:220]}"


def _pat_ranges(path: Path, start: int, size: int) -> list[str]:
    """The PAT list's entries that overlap [start, start + size)."""
    found = []
    for line in _text(path).splitlines():
        hit = re.search(r"\[mem 0x([0-9a-f]+)-0x([0-9a-f]+)\]\s*(.*)", line)
        if hit and int(hit.group(1), 16) < start + size and start < int(hit.group(2), 16):
            found.append(line.strip())
    return found


def check(out: Path) -> list[str]:
    problems: list[str] = []

    def fact(ok: bool, text: str) -> None:
        if ok:
            print(f"vm_check: pool module: fact: {text}")
        else:
            problems.append(text)

    dax, start_text, size_text = [*_text(out / "dax.txt").split(), "", "", ""][:3]
    fact(bool(dax) and start_text.startswith("0x"), f"the nvdimm's device-dax {dax} at "
         f"{start_text}, {size_text} bytes (/sys/bus/dax/devices/{dax}/resource, size)")
    start, size = int(start_text or "0", 16), int(size_text or "0", 16)
    fact(_text(out / "build.rc") == "0", "the module builds against the guest kernel's headers "
         f"(make -C /lib/modules/$(uname -r)/build; rc {_text(out / 'build.rc')}: "
         f"{_text(out / 'build.log')[-200:]})")
    try:
        unloaded = json.loads((out / "probe-unloaded.json").read_text())["inventory"]["pool_module"]
    except (OSError, ValueError, KeyError):
        unloaded = {}
    commands = " ; ".join(unloaded.get("commands") or [])
    fact(not unloaded.get("loaded", True) and "insmod" in commands and start_text in commands,
         f"probe before insmod: not loaded, the commands name this device's range ({commands})")

    for name, needle in (("held", "held by another driver"), ("ram", "overlaps System RAM"),
                         ("zero", "must be page aligned, more than 0 bytes")):
        rc, said = _text(out / f"insmod-{name}.rc"), _text(out / f"insmod-{name}.kmsg")
        fact(rc != "0" and needle in said, f"insmod refuses ({name}): rc {rc}, the kernel log "
             f"says {said!r}")
    ok, said = _one_line_exit_2(out, "held", "held by another driver")
    fact(ok, "nearlocal run on ncmem: after the refused insmod: one line naming the kernel log's "
         f"refusal, exit 2 ({said})")
    fact(not (out / "held-results").exists() or not any((out / "held-results").iterdir()),
         "that run wrote nothing")

    fact(_text(out / "insmod.rc") == "0" and "nearlocal_pool" in _text(out / "iomem-loaded.txt"),
         f"insmod on the freed range loads; /proc/iomem names it ({_text(out / 'insmod.kmsg')})")
    try:
        module = json.loads((out / "probe.json").read_text())["inventory"]["pool_module"]
    except (OSError, ValueError, KeyError):
        module = {}
    fact(bool(module.get("loaded")) and module.get("start") == start and module.get("size") == size,
         f"probe: the module loaded, bound to [{start:#x}, +{size:#x}) (saw start "
         f"{module.get('start')}, size {module.get('size')}, device {module.get('device')})")

    rc = _text(out / "run.rc")
    fact(rc == "0", f"nearlocal run of the B7 rows exits 0 (rc {rc}: {_text(out / 'run.err')[-300:]})")
    rows = {(row["method"], row["attr"]): row for row in _rows(out / "results")
            if row["region"] == REGION}
    for method in METHODS:
        for attr in ("uc", "wc", "wb"):
            row = rows.get((method, attr))
            info = (row or {}).get("info") or {}
            seen = info.get("memtype", "")
            ok = row is not None and row["status"] == "ok" and seen.startswith(PAT_NAMES[attr])
            fact(ok, f"run: {method} {attr} 16 KiB on the pool is measured with memtype "
                 f"{seen or '?'} read back from PAT" + ("" if ok or row is None else
                                                         f" ({row['status']}: {row.get('reason')})"))
    for name, needle in (("beyond", "past the end"), ("zero", "ncmem"), ("attr", "wt")):
        ok, said = _one_line_exit_2(out, f"bad-{name}", needle)
        fact(ok, f"bad input ({name}): one line, exit 2 ({said})")

    fact(_text(out / "mappings-held.txt") == "1", "the holder's write-back mapping is the module's "
         f"one live mapping (mappings {_text(out / 'mappings-held.txt')})")
    conflict = _rows(out / "conflict-results")
    reason = " ".join(str(r.get("reason") or "") for r in conflict) + _text(out / "conflict.err")
    fact(any(r["status"] != "ok" for r in conflict) or _text(out / "conflict.rc") == "2",
         f"uc while another process maps the range write-back is refused (rc "
         f"{_text(out / 'conflict.rc')})")
    fact("PAT" in reason and "write-back" in reason,
         f"the refusal names PAT and the write-back mapping ({reason[:260]})")
    fact(_text(out / "rmmod-busy.rc") != "0", "rmmod with the device mapped is refused "
         f"({_text(out / 'rmmod-busy.out')})")
    fact(_text(out / "mappings-closed.txt") == "0", "the last close leaves no mapping")
    fact(_text(out / "rmmod.rc") == "0" and not (out / "left-module.txt").exists(),
         f"rmmod after the last close: no module left ({_text(out / 'rmmod.out') or 'rc 0'})")
    fact(_text(out / "left-iomem.txt") in ("", "missing"), "no range left claimed in /proc/iomem")
    left = _pat_ranges(out / "pat-after-unload.txt", start, size)
    fact((out / "pat-after-unload.txt").exists() and not left,
         f"no PAT reservation left on the range ({left[:2] or 'none in pat_memtype_list'})")
    ok, said = _one_line_exit_2(out, "bad-missing", "does not exist")
    fact(ok, f"bad input (the character device missing after rmmod): one line, exit 2 ({said})")
    return problems


if __name__ == "__main__":
    found = check(Path(sys.argv[1]))
    for problem in found:
        print(f"vm_check: pool module: FAILED: {problem}", file=sys.stderr)
    sys.exit(1 if found else 0)
