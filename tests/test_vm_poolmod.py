"""scripts/vm_poolmod.py, the pool-module stage's facts (issue 58), on what a good guest writes
(the files of the rig's guest on 2026-12-07, rows rebuilt) and on guests where a type, a refusal
or the clean-up went wrong (no QEMU: synthetic guest output)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.report_fixtures import make_run, row

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import vm_poolmod

START, SIZE = 0x100600000, 0xFA00000
PAT_NAME = {"uc": "uncached-minus", "wc": "write-combining", "wb": "write-back"}
HELD = "nearlocal_pool: [mem 0x100600000-0x10fffffff] is held by another driver (see /proc/iomem): refused"


def _guest(out: Path, *, memtype: dict | None = None, rmmod_busy: str = "1",
           left_module: bool = False, held_err: str | None = None) -> Path:
    files = {
        "dax.txt": f"dax0.0 {START:#x} {SIZE:#x}", "build.rc": "0", "build.log": "LD [M] x.ko",
        "insmod-held.rc": "1", "insmod-held.kmsg": HELD,
        "insmod-ram.rc": "1",
        "insmod-ram.kmsg": "nearlocal_pool: [mem 0x200000-0x2fffff] overlaps System RAM: refused",
        "insmod-zero.rc": "1",
        "insmod-zero.kmsg": "nearlocal_pool: start=0x100600000 size=0x0: the range must be page "
                            "aligned, more than 0 bytes and not wrap",
        "held.rc": "2", "held.err": held_err or (
            "nearlocal: error: /dev/nearlocal-pool0 does not exist (from 'ncmem:/dev/nearlocal-pool0'): the "
            f"nearlocal_pool kernel module is not loaded: its last insmod was refused ({HELD}): load it"),
        "insmod.rc": "0", "insmod.kmsg": "nearlocal_pool: /dev/nearlocal-pool0 maps it",
        "iomem-loaded.txt": "  100600000-10fffffff : nearlocal_pool", "run.rc": "0",
        "bad-beyond.rc": "2", "bad-beyond.err": "nearlocal: error: the window goes past the end of it",
        "bad-zero.rc": "2", "bad-zero.err": "nearlocal: error: malformed size '0' (in 'ncmem:/dev/x@0,0')",
        "bad-attr.rc": "2", "bad-attr.err": "nearlocal: error: unknown attribute 'wt'",
        "mappings-held.txt": "1", "conflict.rc": "0", "conflict.err": "",
        "rmmod-busy.rc": rmmod_busy, "rmmod-busy.out": "rmmod: ERROR: Module nearlocal_pool is in use",
        "mappings-closed.txt": "0", "rmmod.rc": "0", "left-iomem.txt": "",
        "pat-after-unload.txt": "PAT: [mem 0x00000000fd000000-0x00000000fe000000] write-combining",
        "bad-missing.rc": "2", "bad-missing.err": "nearlocal: error: /dev/nearlocal-pool0 does not exist",
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text + "\n")
    if left_module:
        (out / "left-module.txt").write_text("loaded\n")
    pool = {"loaded": False, "commands": [f"load it: insmod x.ko start={START:#x} size={SIZE:#x}"]}
    (out / "probe-unloaded.json").write_text(json.dumps({"inventory": {"pool_module": pool}}))
    loaded = {"loaded": True, "start": START, "size": SIZE, "device": "/dev/nearlocal-pool0"}
    (out / "probe.json").write_text(json.dumps({"inventory": {"pool_module": loaded}}))
    rows = []
    for method in vm_poolmod.METHODS:
        for attr in ("uc", "wc", "wb"):
            data = row(method, vm_poolmod.REGION, attr=attr,
                       access="write" if "store" in method else "read")
            data["info"] = {"memtype": (memtype or {}).get((method, attr), PAT_NAME[attr])}
            rows.append(data)
    make_run(out / "results", rows)
    refused = row("load", vm_poolmod.REGION, attr="uc", status="failed", reason=(
        f"x86 PAT refused uc for [{START:#x}, {START + 16384:#x}): the range is tracked as "
        "write-back by another mapping (one type per range: unmap it first)"))
    make_run(out / "conflict-results", [refused])
    return out


def test_the_facts_hold_on_what_a_good_guest_writes(tmp_path, capsys):
    assert vm_poolmod.check(_guest(tmp_path)) == []
    said = capsys.readouterr().out
    assert said.count("fact:") >= 30 and "clflush-load wc 16 KiB" in said


@pytest.mark.parametrize("damage, needle", [
    ({"memtype": {("nt-store", "wc"): "uncached-minus"}}, "nt-store wc 16 KiB"),
    ({"rmmod_busy": "0"}, "rmmod with the device mapped"),
    ({"left_module": True}, "no module left"),
    ({"held_err": "nearlocal: error: /dev/nearlocal-pool0 does not exist\nTraceback"}, "one line"),
])
def test_a_guest_that_went_wrong_names_the_fact(tmp_path, damage, needle):
    problems = vm_poolmod.check(_guest(tmp_path, **damage))
    assert any(needle in problem for problem in problems), problems
