"""DSA probing from fake sysfs trees (dedicated and shared WQs, DSA without an enabled WQ, no
idxd), the methods' skip reasons, the quick suite's DSA rows, and the CLI on this box."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nearlocal.core.cases import Case, unavailable
from nearlocal.core.methods import load_methods
from nearlocal.core.suites import suite_cases
from nearlocal.frontends.cli import main
from nearlocal.probe import probe
from nearlocal.probe.dsa import decode_op_cap, op_names, probe_dsa
from nearlocal.store import load
from nearlocal.sysroot import SysRoot
from tests.fakesys import CPUINFO, cxl_box, link, write

DSA = "/sys/bus/dsa/devices"
# noop..dif_updt and cflush (Sapphire Rapids) as %*pb prints a 256-bit map: 32-bit groups,
# highest first
OP_CAP_PB = "00000000,00000000,00000000,00000000,00000000,00000000,00000001,003f03ff"


def dsa_tree(root: Path, enabled: bool = True, device_state: str = "enabled",
             cpu_root: bool = True) -> Path:
    """dsa0 with 4 engines (two in group 0), wq0.0 dedicated and wq0.1 shared; an IAA device on
    the same bus that must be ignored."""
    if cpu_root:
        cxl_box(root, dsa_enabled=False)
    write(root, "/sys/module/idxd/refcnt", "0")
    write(root, f"{DSA}/dsa0/version", "0x100")
    write(root, f"{DSA}/dsa0/max_engines", "4")
    write(root, f"{DSA}/dsa0/max_groups", "4")
    write(root, f"{DSA}/dsa0/max_work_queues", "8")
    write(root, f"{DSA}/dsa0/max_work_queues_size", "128")
    write(root, f"{DSA}/dsa0/max_transfer_size", str(2 << 30))
    write(root, f"{DSA}/dsa0/max_batch_size", "1024")
    write(root, f"{DSA}/dsa0/numa_node", "0")
    write(root, f"{DSA}/dsa0/op_cap", OP_CAP_PB)
    write(root, f"{DSA}/dsa0/state", device_state)
    for engine in range(4):
        write(root, f"{DSA}/engine0.{engine}/group_id", "0" if engine < 2 else "-1")
    write(root, f"{DSA}/group0.0/engines", "engine0.0 engine0.1")
    write(root, f"{DSA}/group0.0/work_queues", "wq0.0 wq0.1" if enabled else "")
    for index, mode, size, priority in ((0, "dedicated", 16, 10), (1, "shared", 32, 5)):
        wq = f"{DSA}/wq0.{index}"
        write(root, f"{wq}/mode", mode)
        write(root, f"{wq}/size", str(size if enabled else 0))
        write(root, f"{wq}/priority", str(priority))
        write(root, f"{wq}/type", "user" if enabled else "none")
        write(root, f"{wq}/state", "enabled" if enabled else "disabled")
        write(root, f"{wq}/name", f"app{index}")
        write(root, f"{wq}/group_id", "0" if enabled else "-1")
        write(root, f"{wq}/block_on_fault", "0")
        write(root, f"{wq}/threshold", "0" if mode == "dedicated" else "30")
        write(root, f"{wq}/max_transfer_size", str(1 << 21))
        write(root, f"{wq}/max_batch_size", "32")
        if enabled:
            link(root, f"{wq}/driver", str(root / "sys/bus/dsa/drivers/user"))
            write(root, f"/dev/dsa/wq0.{index}", "")
    write(root, f"{DSA}/iax1/version", "0x100")
    write(root, f"{DSA}/wq1.0/mode", "dedicated")
    return root


def test_op_cap_formats():
    assert decode_op_cap("0x1ff") == 0x1FF  # before 5.13: the low 64 bits
    assert decode_op_cap("0x1ff 0x0 0x0 0x1") == 0x1FF | 1 << 192  # four words, lowest first
    assert decode_op_cap(OP_CAP_PB) == 0x3F03FF | 1 << 32
    assert decode_op_cap("") == 0 and decode_op_cap(None) == 0
    assert op_names(decode_op_cap(OP_CAP_PB))[:5] == ["noop", "batch", "drain", "memmove",
                                                       "memfill"]
    assert op_names(decode_op_cap(OP_CAP_PB))[-1] == "cflush"
    assert "cflush" not in op_names(0x3F03FF) and "op0x80" in op_names(1 << 128)


def test_dedicated_and_shared_work_queues(tmp_path):
    info = probe_dsa(SysRoot(dsa_tree(tmp_path)))
    assert info.module_loaded and info.reason() is None
    (dev,) = info.devices
    assert (dev.version, dev.max_engines, dev.max_groups, dev.max_work_queues_size) == (
        "0x100", 4, 4, 128)
    assert dev.operations[:4] == ["noop", "batch", "drain", "memmove"]
    assert [(e.name, e.group_id) for e in dev.engines] == [
        ("engine0.0", 0), ("engine0.1", 0), ("engine0.2", -1), ("engine0.3", -1)]
    assert dev.groups[0].engines == ["engine0.0", "engine0.1"]
    dwq, swq = dev.work_queues
    assert (dwq.name, dwq.mode, dwq.size, dwq.priority, dwq.type, dwq.state, dwq.driver) == (
        "wq0.0", "dedicated", 16, 10, "user", "enabled", "user")
    assert (swq.mode, swq.threshold, swq.block_on_fault, swq.max_batch_size) == (
        "shared", 30, False, 32)
    assert dwq.submit_instruction == "movdir64b" and swq.submit_instruction == "enqcmd"
    assert info.usable_wqs == [dwq, swq]
    assert info.char_devices == ["/dev/dsa/wq0.0", "/dev/dsa/wq0.1"]


def test_dsa_present_but_no_enabled_wq_prints_accel_config(tmp_path):
    info = probe_dsa(SysRoot(dsa_tree(tmp_path, enabled=False, device_state="disabled")))
    assert info.usable_wqs == []
    reason = info.reason()
    assert reason.startswith("DSA present but no enabled user work queue; enable one with: ")
    commands = reason.split(": ", 1)[1].split(" && ")
    assert commands == [
        "accel-config config-wq dsa0/wq0.0 --group-id=0 --mode=dedicated --wq-size=16 "
        "--priority=10 --type=user --name=nearlocal --driver-name=user",
        "accel-config enable-device dsa0",
        "accel-config enable-wq dsa0/wq0.0",
    ]


def test_enabled_device_needs_only_the_wq(tmp_path):
    info = probe_dsa(SysRoot(dsa_tree(tmp_path, enabled=False, device_state="enabled")))
    assert info.devices[0].enable_commands()[-1] == "accel-config enable-wq dsa0/wq0.0"
    assert not any("enable-device" in c for c in info.devices[0].enable_commands())


def test_enabled_wq_without_char_device(tmp_path):
    root = dsa_tree(tmp_path)
    for index in (0, 1):
        (root / f"dev/dsa/wq0.{index}").unlink()
    assert "/dev/dsa/wq0.0 is missing" in probe_dsa(SysRoot(root)).reason()


def test_no_idxd(tmp_path):
    info = probe_dsa(SysRoot(tmp_path))
    assert not info.module_loaded and info.devices == []
    assert info.reason().startswith("no DSA: the idxd driver is not loaded")
    write(tmp_path, "/sys/module/idxd/refcnt", "0")
    assert "lists no DSA devices" in probe_dsa(SysRoot(tmp_path)).reason()


def _reason(inventory, method: str = "dsa-memmove") -> str | None:
    return unavailable(Case(method, "dram", "wb", "16KiB"), inventory, False)


def test_methods_skip_with_the_probe_reason(tmp_path):
    load_methods()
    write(tmp_path / "none", "/proc/cpuinfo", CPUINFO)
    assert _reason(probe(SysRoot(tmp_path / "none"), calibrate=False, gpu=False)).startswith(
        "no DSA: the idxd driver is not loaded")
    ready = probe(SysRoot(dsa_tree(tmp_path / "ready")), calibrate=False, gpu=False)
    assert _reason(ready) is None and _reason(ready, "dsa-batch") is None
    off = probe(SysRoot(dsa_tree(tmp_path / "off", enabled=False)), calibrate=False, gpu=False)
    assert "accel-config enable-wq dsa0/wq0.0" in _reason(off)


def test_shared_wq_without_enqcmd(tmp_path):
    root = dsa_tree(tmp_path)
    (root / "dev/dsa/wq0.0").unlink()  # only the shared WQ is usable
    cpuinfo = (root / "proc/cpuinfo").read_text().replace(" enqcmd", "")
    (root / "proc/cpuinfo").write_text(cpuinfo)
    inventory = probe(SysRoot(root), calibrate=False, gpu=False)
    assert "DSA wq0.1 is a shared WQ but the CPU lacks enqcmd" in _reason(inventory)


def test_quick_suite_lists_dsa_rows():
    cases = [c for c in suite_cases("quick") if c.method.startswith("dsa-")]
    methods = {c.method for c in cases}
    assert methods == {"dsa-memmove", "dsa-batch"}
    assert {c.pattern for c in cases} >= {"64B", "16KiB", "64MiB"}
    assert all(c.region == "dram" and c.attr == "wb" for c in cases)
    assert len(suite_cases("dsa")) > 20


def test_probe_explains_dsa(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(dsa_tree(tmp_path, enabled=False,
                                                          device_state="disabled")))
    assert main(["probe", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = [r for r in data["availability"] if r["method"] == "dsa-memmove"]
    assert rows and all("accel-config enable-wq dsa0/wq0.0" in r["reason"] for r in rows)
    device = data["inventory"]["dsa"]["devices"][0]
    assert device["work_queues"][0]["mode"] == "dedicated" and "memmove" in device["operations"]
    assert main(["probe"]) == 0
    text = capsys.readouterr().out
    assert "dsa0 v0x100 disabled" in text and "wq0.0: dedicated" in text
    assert "accel-config enable-wq dsa0/wq0.0" in text


def test_run_on_this_box(tmp_path):
    """Here (no DSA) the case is skipped with the probe's reason; on a box with a user WQ it runs."""
    inventory = probe(calibrate=False, gpu=False)
    code = main(["run", "--method", "dsa-memmove", "--size", "16KiB", "--budget", "0.05",
                 "--out", str(tmp_path), "--quiet"])
    assert code == 0
    (row,) = load(None, tmp_path).cases.itertuples()
    reason = _reason(inventory)
    if reason is None:
        pytest.skip("this box has a usable DSA WQ: see the dsa-marked tests")
    assert row.status == "skipped" and row.reason == reason


def test_bad_parameter_values_exit_2_without_dsa(tmp_path):
    for bad in ("qd=many", "wait=sleep", "cc=2"):
        assert main(["run", "--method", "dsa-memmove", "--param", bad, "--out",
                     str(tmp_path), "--quiet"]) == 2
    assert main(["run", "--method", "dsa-batch", "--param", "batch=1", "--out", str(tmp_path),
                 "--quiet"]) == 2


@pytest.mark.dsa
def test_real_dsa_copy(tmp_path):
    inventory = probe(calibrate=False, gpu=False)
    if _reason(inventory):
        pytest.skip(_reason(inventory))
    code = main(["run", "--method", "dsa-memmove", "--method", "dsa-batch", "--size",
                 "64,16KiB,1MiB", "--budget", "0.05", "--out", str(tmp_path), "--quiet"])
    assert code == 0
    cases = load(None, tmp_path).cases
    assert (cases["status"] == "ok").all(), cases[["case_id", "status", "reason"]]
