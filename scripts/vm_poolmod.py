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

import re
import sys
from pathlib import Path

from vm_lib import Facts, exit_fact, finish, read_json, rows, text

METHODS = ("load", "store", "nt-store", "clflush-load")
REGION = "ncmem:/dev/nearlocal-pool0"
PAT_NAMES = {"uc": "uncached", "wc": "write-combining", "wb": "write-back"}


def _one_line_exit_2(out: Path, name: str, needle: str) -> tuple[bool, str]:
    """A run that must end with one line on stderr and exit 2, the line holding `needle`."""
    rc, err = text(out / f"{name}.rc"), text(out / f"{name}.err")
    ok = rc == "2" and len(err.splitlines()) == 1 and needle in err
    return ok, f"rc {rc}: {err[:220]}"


def _pat_ranges(path: Path, start: int, size: int) -> list[str]:
    """The PAT list's entries that overlap [start, start + size)."""
    found = []
    for line in text(path).splitlines():
        hit = re.search(r"\[mem 0x([0-9a-f]+)-0x([0-9a-f]+)\]\s*(.*)", line)
        if hit and int(hit.group(1), 16) < start + size and start < int(hit.group(2), 16):
            found.append(line.strip())
    return found


def check(out: Path) -> list[str]:
    fact = Facts()
    dax, start_text, size_text = [*text(out / "dax.txt").split(), "", "", ""][:3]
    fact(bool(dax) and start_text.startswith("0x"), f"the nvdimm's device-dax {dax} at "
         f"{start_text}, {size_text} bytes (/sys/bus/dax/devices/{dax}/resource, size)")
    start, size = int(start_text or "0", 16), int(size_text or "0", 16)
    fact(text(out / "build.rc") == "0", "the module builds against the guest kernel's headers "
         f"(make -C /lib/modules/$(uname -r)/build; rc {text(out / 'build.rc')}: "
         f"{text(out / 'build.log')[-200:]})")
    unloaded = (read_json(out / "probe-unloaded.json").get("inventory") or {}).get("pool_module") or {}
    commands = " ; ".join(unloaded.get("commands") or [])
    fact(not unloaded.get("loaded", True) and "insmod" in commands and start_text in commands,
         f"probe before insmod: not loaded, the commands name this device's range ({commands})")

    for name, needle in (("held", "held by another driver"), ("ram", "overlaps System RAM"),
                         ("zero", "must be page aligned, more than 0 bytes")):
        rc, said = text(out / f"insmod-{name}.rc"), text(out / f"insmod-{name}.kmsg")
        fact(rc != "0" and needle in said, f"insmod refuses ({name}): rc {rc}, the kernel log "
             f"says {said!r}")
    ok, said = _one_line_exit_2(out, "held", "held by another driver")
    fact(ok, "nearlocal run on ncmem: after the refused insmod: one line naming the kernel log's "
         f"refusal, exit 2 ({said})")
    fact(not (out / "held-results").exists() or not any((out / "held-results").iterdir()),
         "that run wrote nothing")

    fact(text(out / "insmod.rc") == "0" and "nearlocal_pool" in text(out / "iomem-loaded.txt"),
         f"insmod on the freed range loads; /proc/iomem names it ({text(out / 'insmod.kmsg')})")
    module = (read_json(out / "probe.json").get("inventory") or {}).get("pool_module") or {}
    fact(bool(module.get("loaded")) and module.get("start") == start and module.get("size") == size,
         f"probe: the module loaded, bound to [{start:#x}, +{size:#x}) (saw start "
         f"{module.get('start')}, size {module.get('size')}, device {module.get('device')})")

    exit_fact(fact, out, "run", "nearlocal run of the B7 rows exits 0")
    measured = {(row["method"], row["attr"]): row for row in rows(out / "results")
                if row["region"] == REGION}
    for method in METHODS:
        for attr in ("uc", "wc", "wb"):
            row = measured.get((method, attr))
            info = (row or {}).get("info") or {}
            seen = info.get("memtype", "")
            ok = row is not None and row["status"] == "ok" and seen.startswith(PAT_NAMES[attr])
            fact(ok, f"run: {method} {attr} 16 KiB on the pool is measured with memtype "
                 f"{seen or '?'} read back from PAT" + ("" if ok or row is None else
                                                         f" ({row['status']}: {row.get('reason')})"))
    for name, needle in (("beyond", "past the end"), ("zero", "ncmem"), ("attr", "wt")):
        ok, said = _one_line_exit_2(out, f"bad-{name}", needle)
        fact(ok, f"bad input ({name}): one line, exit 2 ({said})")

    fact(text(out / "mappings-held.txt") == "1", "the holder's write-back mapping is the module's "
         f"one live mapping (mappings {text(out / 'mappings-held.txt')})")
    conflict = rows(out / "conflict-results")
    reason = " ".join(str(r.get("reason") or "") for r in conflict) + text(out / "conflict.err")
    fact(any(r["status"] != "ok" for r in conflict) or text(out / "conflict.rc") == "2",
         f"uc while another process maps the range write-back is refused (rc "
         f"{text(out / 'conflict.rc')})")
    fact("PAT" in reason and "write-back" in reason,
         f"the refusal names PAT and the write-back mapping ({reason[:260]})")
    fact(text(out / "rmmod-busy.rc") != "0", "rmmod with the device mapped is refused "
         f"({text(out / 'rmmod-busy.out')})")
    fact(text(out / "mappings-closed.txt") == "0", "the last close leaves no mapping")
    fact(text(out / "rmmod.rc") == "0" and not (out / "left-module.txt").exists(),
         f"rmmod after the last close: no module left ({text(out / 'rmmod.out') or 'rc 0'})")
    fact(text(out / "left-iomem.txt") in ("", "missing"), "no range left claimed in /proc/iomem")
    left = _pat_ranges(out / "pat-after-unload.txt", start, size)
    fact((out / "pat-after-unload.txt").exists() and not left,
         f"no PAT reservation left on the range ({left[:2] or 'none in pat_memtype_list'})")
    ok, said = _one_line_exit_2(out, "bad-missing", "does not exist")
    fact(ok, f"bad input (the character device missing after rmmod): one line, exit 2 ({said})")
    return fact.report("vm_check: pool module: fact: ")


if __name__ == "__main__":
    sys.exit(finish(check(Path(sys.argv[1])), "vm_check: pool module: FAILED: "))
