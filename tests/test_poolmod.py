"""The nearlocal_pool kernel module from nearlocal's side (probe/poolmod.py, the `ncmem:` region
kind, uc / wc on `devdax:`): what probe says with the module absent or loaded, bad input as one
line, the errno the module answers turned into one line, and the PAT type read back. The module
itself (kmod/nearlocal_pool) is built and loaded in the VM rig; here its sysfs attributes and
device are fake (tests/fakesys.py pool_module_box)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from nearlocal.errors import UsageError
from nearlocal.probe import probe
from nearlocal.probe.poolmod import DEVICE, WINDOWS, probe_pool_module
from nearlocal.regions import attribute_unavailable, parse_region, region_kind
from nearlocal.sysroot import SysRoot
from tests.fakesys import cxl_box, pool_module_box, write

START = 0x1080000000
PAT = "/sys/kernel/debug/x86/pat_memtype_list"


@pytest.fixture
def module_box(tmp_path, monkeypatch):
    """The module bound to 16 MiB at START; its type windows at offset 0 (the fake device is a
    plain file)."""
    root = pool_module_box(tmp_path, START)
    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(root))
    monkeypatch.setattr("nearlocal.regions.devices.WINDOWS", dict.fromkeys(WINDOWS, 0))
    return root


def test_without_the_module_probe_gives_the_commands(tmp_path):
    root = cxl_box(tmp_path)
    write(root, "/sys/bus/dax/devices/dax0.0/resource", hex(START))
    module = probe(SysRoot(root), calibrate=False, gpu=False).pool_module
    assert not module.loaded and not module.usable
    reason = module.reason()
    assert "make -C" in reason and "kmod/nearlocal_pool" in reason and "dkms" in reason
    assert "echo dax0.0 > /sys/bus/dax/drivers/device_dax/unbind" in reason
    assert f"start={START:#x} size={16 << 30:#x}" in reason and "\n" not in reason


def test_uc_and_wc_on_devdax_are_skipped_with_the_commands_without_the_module(tmp_path, monkeypatch):
    root = cxl_box(tmp_path)
    write(root, "/sys/bus/dax/devices/dax0.0/resource", hex(START))
    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(root))
    spec = parse_region("devdax:/dev/dax0.0")
    assert attribute_unavailable(spec, "wb") is None
    for attr in ("uc", "wc"):
        reason = attribute_unavailable(spec, attr)
        assert "needs the nearlocal_pool module" in reason and "insmod" in reason


def test_a_loaded_module_is_probed_with_its_range(module_box):
    module = probe_pool_module(SysRoot(module_box))
    assert module.usable and (module.start, module.size, module.mappings) == (START, 16 << 20, 0)
    assert module.device == DEVICE and module.reason() is None and module.commands == []
    assert module.covers(START + 4096, 4096) and not module.covers(START, 32 << 20)
    inventory = probe(SysRoot(module_box), calibrate=False, gpu=False)
    assert region_kind(parse_region(f"ncmem:{DEVICE}")).instances(inventory) == [f"ncmem:{DEVICE}"]


@pytest.mark.parametrize("text, message", [
    ("ncmem:/dev/sda", "malformed ncmem region"),
    (f"ncmem:{DEVICE}@0,0", "malformed size '0': must be a positive"),
    (f"ncmem:{DEVICE}@100", "page size"),
    (f"ncmem:{DEVICE}@8MiB,16MiB", "past the end of the nearlocal_pool module's range"),
    (f"ncmem:{DEVICE}@16MiB", "past the end"),
    ("ncmem:/dev/nearlocal-pool1", "does not exist .*device is /dev/nearlocal-pool0"),
])
def test_bad_ncmem_input_is_one_line(module_box, text, message):
    spec = parse_region(text)
    with pytest.raises(UsageError, match=message) as caught:
        region_kind(spec).validate(spec, None)
    assert "\n" not in str(caught.value)


def test_a_module_range_over_system_ram_is_refused(module_box):
    write(module_box, "/proc/iomem", f"{START:x}-{START + (1 << 30) - 1:x} : System RAM")
    spec = parse_region(f"ncmem:{DEVICE}")
    with pytest.raises(UsageError, match="overlaps System RAM"):
        region_kind(spec).validate(spec, None)


def test_the_device_missing_names_the_module_commands(tmp_path, monkeypatch):
    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(cxl_box(tmp_path)))
    spec = parse_region(f"ncmem:{DEVICE}")
    with pytest.raises(UsageError, match=r"does not exist.*(not built|not loaded)"):
        region_kind(spec).validate(spec, None)
    loaded = pool_module_box(tmp_path / "b", device=False)
    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(loaded))
    with pytest.raises(UsageError, match=f"{DEVICE} is missing"):
        region_kind(spec).validate(spec, None)


def test_an_attr_the_module_does_not_know(module_box):
    spec = parse_region(f"ncmem:{DEVICE}")
    with pytest.raises(UsageError, match="unknown attribute 'wt'"):
        attribute_unavailable(spec, "wt")
    with pytest.raises(UsageError, match="maps wb, uc, wc, not 'wt'"):
        region_kind(spec).open(spec, 4096, "wt", False)


def test_the_mapping_records_the_pat_type_and_a_wrong_one_fails_naming_both(module_box):
    write(module_box, PAT, f"PAT: [mem 0x{START:016x}-0x{START + (16 << 20):016x}] uncached")
    spec = parse_region(f"ncmem:{DEVICE}@4KiB")
    region = region_kind(spec).open(spec, 8192, "uc", False)
    try:
        assert region.info["memtype"] == "uncached" and region.info["via"] == DEVICE
        assert region.info["physical"] == hex(START + 4096) and region.array.size == 8192
    finally:
        region.close()
    with pytest.raises(UsageError) as caught:
        region_kind(spec).open(spec, 4096, "wc", False)
    assert "asked wc (write-combining)" in str(caught.value) and "mapped it uncached" in str(caught.value)


def test_devdax_goes_through_the_module_bound_to_its_range(module_box):
    write(module_box, "/sys/bus/dax/devices/dax0.0/resource", hex(START))
    write(module_box, PAT, f"PAT: [mem 0x{START:016x}-0x{START + (16 << 20):016x}] write-combining")
    spec = parse_region("devdax:/dev/dax0.0@2MiB,2MiB")
    assert attribute_unavailable(spec, "wc") is None and attribute_unavailable(spec, "uc") is None
    region = region_kind(spec).open(spec, 4096, "wc", False)
    try:
        assert region.info["via"] == DEVICE and region.info["physical"] == hex(START + (2 << 20))
        assert region.info["memtype"] == "write-combining" and region.info["device"] == "/dev/dax0.0"
    finally:
        region.close()
    far = parse_region("devdax:/dev/dax0.0@1GiB,2MiB")  # past the module's 16 MiB
    assert "not to this device's" in attribute_unavailable(far, "uc")


def test_the_errnos_the_module_answers_are_one_line_each(module_box):
    from nearlocal.regions.devices import _module_error

    module = probe_pool_module(SysRoot(module_box))
    why = _module_error(module, START, 4096, "uc")
    texts = {code: why(OSError(code, os.strerror(code)))
             for code in (errno.ENXIO, errno.EINVAL, errno.EPERM, errno.EAGAIN, errno.EIO)}
    assert "beyond the nearlocal_pool module's range" in texts[errno.ENXIO]
    assert "a type it does not know" in texts[errno.EINVAL]
    assert "CAP_SYS_RAWIO" in texts[errno.EPERM]
    assert "x86 PAT refused uc" in texts[errno.EAGAIN]
    assert all("\n" not in text for text in texts.values())
    write(module_box, PAT, f"PAT: [mem 0x{START:016x}-0x{START + 65536:016x}] write-back")
    tracked = why(OSError(errno.EINVAL, os.strerror(errno.EINVAL)))  # remap_pfn_range's refusal
    assert "x86 PAT refused uc" in tracked and "tracked as write-back" in tracked


def test_a_run_naming_a_missing_device_exits_2_with_one_line(tmp_path):
    env = {**os.environ, "NEARLOCAL_SYSROOT": str(cxl_box(tmp_path))}
    done = subprocess.run([sys.executable, "-m", "nearlocal.frontends.cli", "run", "--region",
                           f"ncmem:{DEVICE}", "--method", "load", "--attr", "uc", "--out",
                           str(tmp_path / "store")], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert f"{DEVICE} does not exist" in done.stderr and "nearlocal_pool" in done.stderr


def test_an_insmod_the_module_refused_is_named_from_the_kernel_log(tmp_path, monkeypatch):
    """Issue 58: insmod on a range device-dax still holds fails with EBUSY and one line in the
    kernel log; the run naming the missing device quotes that line (which driver, which range)."""
    root = cxl_box(tmp_path)
    refused = (f"nearlocal_pool: [mem {START:#x}-{START + (16 << 20) - 1:#x}] is held by another "
               "driver (see /proc/iomem): refused")
    write(root, "/dev/kmsg", f"6,100,5,-;nearlocal_pool: earlier line\n3,101,6,-;{refused}\n")
    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(root))
    assert probe_pool_module(SysRoot(root)).refusal == refused
    spec = parse_region(f"ncmem:{DEVICE}")
    with pytest.raises(UsageError, match="held by another driver") as caught:
        region_kind(spec).validate(spec, None)
    assert "\n" not in str(caught.value)
    write(root, "/dev/kmsg", f"3,101,6,-;{refused}\n6,102,7,-;nearlocal_pool: /dev/x maps it\n")
    assert probe_pool_module(SysRoot(root)).refusal is None  # a later load's line is no refusal
