"""Real uc / wc providers: pcibar (a BAR's resourceN / resourceN_wc), /dev/mem (phys:, uc on
devdax), the memory type read back from the PAT list, and a disagreeing readback as a failed row.
The PCI and PAT trees here are fake (this box has no BAR to give); the ones recorded from a QEMU
guest are in tests/fixtures/ (test_guest_trees.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nearlocal.errors import UsageError
from nearlocal.probe import pat, probe
from nearlocal.probe.pci import normal_address, probe_pci_memory, read_bars
from nearlocal.regions import attribute_unavailable, parse_region, region_kind
from nearlocal.sysroot import SysRoot
from tests.fakesys import cxl_box, write

BAR2 = 0xFE800000
DEVICE = "0000:00:0b.0"


def bar_box(root: Path, memtype: str = "uncached-minus") -> Path:
    """cxl_box plus an ivshmem device: BAR0 registers (non-prefetchable, no _wc), BAR1 I/O
    ports, BAR2 a 1 MiB prefetchable memory BAR with resource2 and resource2_wc; the PAT list
    says BAR2 is mapped `memtype`."""
    cxl_box(root)
    base = f"/sys/bus/pci/devices/{DEVICE}"
    write(root, f"{base}/class", "0x050000")
    write(root, f"{base}/vendor", "0x1af4")
    write(root, f"{base}/device", "0x1110")
    lines = ["0x00000000febf1000 0x00000000febf10ff 0x0000000000040200",
             "0x000000000000c000 0x000000000000c0ff 0x0000000000040101",
             f"0x{BAR2:016x} 0x{BAR2 + (1 << 20) - 1:016x} 0x000000000014220c"]
    lines += ["0x0000000000000000 0x0000000000000000 0x0000000000000000"] * 10
    write(root, f"{base}/resource", "\n".join(lines))
    for name in ("resource0", "resource2", "resource2_wc"):
        path = root / base.lstrip("/") / name
        with open(path, "wb") as f:
            f.truncate(0x100 if name == "resource0" else 1 << 20)
    write(root, "/sys/kernel/debug/x86/pat_memtype_list",
          "PAT memtype list:\n"
          "PAT: [mem 0x00000000000a0000-0x00000000000c0000] uncached-minus\n"
          f"PAT: [mem 0x{BAR2:016x}-0x{BAR2 + (1 << 20):016x}] {memtype}")
    return root


@pytest.fixture
def bars(tmp_path, monkeypatch):
    root = bar_box(tmp_path)
    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(root))
    return root


def test_pci_addresses_and_bars_are_read_from_the_resource_table(bars):
    assert normal_address("00:0B.0") == DEVICE and normal_address("0b.0") is None
    found = read_bars(SysRoot(bars), DEVICE)
    assert [(b.index, b.memory, b.prefetchable, b.wc_file) for b in found[:3]] == [
        (0, True, False, False), (1, False, False, False), (2, True, True, True)]
    assert found[2].start == BAR2 and found[2].size == 1 << 20
    (device,) = probe_pci_memory(SysRoot(bars))
    assert device.address == DEVICE and [b.index for b in device.bars] == [0, 2]
    assert probe(SysRoot(bars), calibrate=False, gpu=False).pci_memory == [device]


@pytest.mark.parametrize("text, message", [
    ("pcibar:00:0b.0", "malformed PCI BAR"),
    ("pcibar:zz:0b.0/2", "malformed PCI BAR"),
    ("pcibar:0000:00:0c.0/2", "does not exist"),
    ("pcibar:0000:00:0b.0/1", "I/O port BAR, not memory"),
    ("pcibar:0000:00:0b.0/4", "unassigned, not memory"),
    ("pcibar:0000:00:0b.0/2@2MiB", "past the end"),
    ("pcibar:0000:00:0b.0/2@100", "page size"),
])
def test_bad_bars_are_one_line_usage_errors(bars, text, message):
    spec = parse_region(text)
    with pytest.raises(UsageError, match=message) as caught:
        region_kind(spec).validate(spec, None)
    assert "\n" not in str(caught.value)


def test_wc_needs_a_prefetchable_bar_and_wb_is_not_offered(bars):
    assert attribute_unavailable(parse_region(f"pcibar:{DEVICE}/2"), "wc") is None
    assert attribute_unavailable(parse_region(f"pcibar:{DEVICE}/2"), "uc") is None
    reason = attribute_unavailable(parse_region(f"pcibar:{DEVICE}/0"), "wc")
    assert "not prefetchable" in reason and "resource0_wc" in reason
    assert attribute_unavailable(parse_region(f"pcibar:{DEVICE}/2"), "wb")


def test_a_bar_is_written_only_with_allow_write_and_never_listed_unnamed(bars):
    kind = region_kind(parse_region(f"pcibar:{DEVICE}/2"))
    assert kind.user_owned(parse_region(f"pcibar:{DEVICE}/2"))
    assert kind.instances(None) == []  # no suite picks a BAR by itself


def test_the_mapping_records_the_type_read_back(bars):
    spec = parse_region(f"pcibar:{DEVICE}/2@4KiB")
    region = region_kind(spec).open(spec, 8192, "uc", False)
    try:
        assert region.info["memtype"] == "uncached-minus"
        assert region.info["file"] == "resource2" and region.info["physical"] == hex(BAR2 + 4096)
        assert not region.writable and region.array.size == 8192
    finally:
        region.close()


def test_a_readback_other_than_the_asked_attribute_fails_naming_both(bars):
    spec = parse_region(f"pcibar:{DEVICE}/2")
    with pytest.raises(UsageError) as caught:
        region_kind(spec).open(spec, 4096, "wc", False)
    text = str(caught.value)
    assert "asked wc (write-combining)" in text and "mapped it uncached-minus" in text
    assert pat.PAT_LIST in text and "\n" not in text


def test_pat_readback_and_agreement():
    assert pat.disagreement("uc", "uncached-minus", "x") is None
    assert pat.disagreement("wb", "write-back (no PAT reservation covers the range: ...)", "x") is None
    assert pat.disagreement("wc", "unknown: not readable", "x") is None  # recorded, not guessed
    assert "mapped it write-back" in pat.disagreement("uc", "write-back", "x")
    assert "uncached-minus + write-back" in pat.disagreement("wb", "uncached-minus + write-back", "x")


def test_pat_list_absent_in_a_fake_tree_is_an_unknown_type_with_its_reason(tmp_path):
    found = pat.memtype(SysRoot(tmp_path), 0x1000, 4096)
    assert found.startswith("unknown:") and "absent" in found


def test_file_on_a_sysfs_resource_points_to_pcibar():
    spec = parse_region(f"file:/sys/bus/pci/devices/{DEVICE}/resource2_wc")
    with pytest.raises(UsageError, match=rf"pcibar:{DEVICE}/2 \(with attr uc or wc\)"):
        region_kind(spec).validate(spec, None)


def test_phys_ranges_are_checked_and_refused_where_the_kernel_refuses(tmp_path, monkeypatch):
    for bad in ("phys:4096,4KiB", "phys:0x1001,4KiB", "phys:0x1000", "phys:0x1000,lots"):
        spec = parse_region(bad)
        with pytest.raises(UsageError):
            region_kind(spec).validate(spec, None)
    root = cxl_box(tmp_path)
    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(root))
    spec = parse_region("phys:0x100000000,1GiB")
    assert "/dev/mem is absent" in region_kind(spec).unavailable(spec, None)
    write(root, "/dev/mem", "")
    write(root, f"/boot/config-{os.uname().release}", "CONFIG_STRICT_DEVMEM=y\nCONFIG_IO_STRICT_DEVMEM=y")
    write(root, "/proc/iomem", "00001000-0009ffff : System RAM\n100000000-17fffffff : System RAM\n"
          "180000000-1bfffffff : Persistent Memory\n  180000000-1bfffffff : namespace0.0\n"
          "    180000000-1bfffffff : dax0.0")
    assert "CONFIG_STRICT_DEVMEM" in region_kind(spec).unavailable(spec, None)
    hole = parse_region("phys:0x180000000,4KiB")
    assert region_kind(hole).unavailable(hole, None) is None  # not RAM, no driver claim asked
    write(root, "/sys/bus/dax/devices/dax0.0/resource", "0x180000000")
    write(root, "/proc/cmdline", "console=ttyS0 iomem=relaxed")
    for attr in ("uc", "wc"):  # /dev/mem no more: PAT refuses it while device-dax is bound
        reason = attribute_unavailable(parse_region("devdax:/dev/dax0.0"), attr)
        assert reason.startswith(f"{attr} on device-dax needs the nearlocal_pool module")
        assert "start=0x180000000 size=0x400000000" in reason and "\n" not in reason


def _nearlocal(*args, env):
    return subprocess.run([sys.executable, "-m", "nearlocal.frontends.cli", *args], capture_output=True,
                          text=True, env=env, timeout=600)


def test_a_pcibar_run_stores_the_kernel_type_and_fails_a_wrong_one(bars, tmp_path):
    from nearlocal.store import load

    env = {**os.environ, "NEARLOCAL_SYSROOT": str(bars)}
    out = tmp_path / "store"
    done = _nearlocal("run", "--region", f"pcibar:{DEVICE}/2", "--attr", "uc,wc", "--method",
                      "load", "--size", "4KiB", "--budget", "0.02", "--out", str(out), "--quiet",
                      env=env)
    assert done.returncode == 0, done.stderr
    run = load(next(p for p in out.iterdir() if p.is_dir()))
    rows = {row["attr"]: row for row in run.cases.to_dict("records")}
    assert rows["uc"]["status"] == "ok"
    assert rows["uc"]["info"]["memtype"] == "uncached-minus"
    assert rows["wc"]["status"] == "failed" and "asked wc" in rows["wc"]["reason"] \
        and "uncached-minus" in rows["wc"]["reason"]
    bad = _nearlocal("run", "--region", f"pcibar:{DEVICE}/1", "--method", "load", "--attr", "uc",
                     "--out", str(out), env=env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not memory" in bad.stderr
    refused = _nearlocal("run", "--region", f"pcibar:{DEVICE}/2", "--attr", "uc", "--method",
                         "store", "--size", "4KiB", "--out", str(out), env=env)
    assert refused.returncode == 2 and "--allow-write" in refused.stderr


def test_a_refused_uncached_devmem_mapping_names_pat_and_the_type_it_holds(tmp_path, monkeypatch):
    """What the guest's 6.1 kernel answers for uc on device-dax through /dev/mem (iomem=relaxed):
    mmap fails with EAGAIN because PAT tracks the range write-back."""
    import errno

    from nearlocal.regions.devices import _devmem_error

    write(tmp_path, "/sys/kernel/debug/x86/pat_memtype_list",
          "PAT: [mem 0x0000000100000000-0x0000000110000000] write-back")
    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(tmp_path))
    why = _devmem_error(0x100600000, 4096)(OSError(errno.EAGAIN, "Resource temporarily unavailable"))
    assert "x86 PAT already tracks the range as write-back" in why and "\n" not in why
    assert "STRICT_DEVMEM" in _devmem_error(0x1000, 4096)(OSError(errno.EPERM, "no"))
