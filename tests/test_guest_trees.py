"""Probes and providers on trees recorded from a real kernel: a QEMU guest (Debian's 6.1 under
TCG, scripts/vm_check.sh --keep-trees) with a CPU-less node, an nvdimm as device-dax, a CXL
type-3 device whose pmem region carries device-dax, and an ivshmem BAR; its PAT list was read
with BAR2 mapped through resource2_wc. Fake trees (tests/fakesys.py) remain only for what no
guest of ours presents: DSA work queues, a CXL region in ram mode (6.1 refuses one), a large
CPU-less system-ram node, a TSC frequency in sysfs."""

from __future__ import annotations

from pathlib import Path

import pytest

from nearlocal.errors import UsageError
from nearlocal.probe import pat, probe
from nearlocal.sysroot import SysRoot

GUEST = Path(__file__).parent / "fixtures" / "guest-6.1"
BAR = "0000:00:0b.0"


@pytest.fixture
def guest(monkeypatch):
    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(GUEST))
    return probe(SysRoot(GUEST), calibrate=False, gpu=False)


def test_the_guest_has_a_cpu_less_node(guest):
    node0, node1 = guest.numa
    assert node0.cpus == [0, 1] and not node0.likely_cxl
    assert node1.cpus == [] and node1.mem_total_bytes > 256 << 20 and node1.likely_cxl
    assert node0.distances == [10, 20] and node1.distances == [20, 10]


def test_the_cxl_type3_device_its_decoders_and_region(guest):
    cxl = guest.cxl
    assert cxl.present
    (mem,) = cxl.memdevs
    assert (mem.name, mem.ram_bytes, mem.pmem_bytes) == ("mem0", 0, 256 << 20)
    decoders = {d.name: d for d in cxl.decoders}
    assert set(decoders) == {"decoder0.0", "decoder1.0", "decoder2.0"}
    assert decoders["decoder0.0"].size == 4 << 30  # the CXL fixed memory window (cxl-fmw.0)
    assert decoders["decoder2.0"].mode == "pmem" and decoders["decoder2.0"].interleave_ways == 1
    (region,) = cxl.regions
    assert (region.name, region.size, region.interleave_ways, region.interleave_granularity) == (
        "region0", 256 << 20, 1, 256)
    assert region.targets == ["decoder2.0"] and region.start == decoders["decoder0.0"].start


def test_device_dax_on_the_nvdimm_and_on_the_cxl_region(guest):
    dax = {d.name: d for d in guest.dax}
    assert set(dax) == {"dax0.0", "dax1.0"}
    assert all(d.mode == "devdax" and d.align == 2 << 20 and d.size == 250 << 20
               for d in dax.values())
    cxl_start = guest.cxl.regions[0].start
    on_cxl = [d for d in dax.values() if cxl_start <= d.resource < cxl_start + (256 << 20)]
    assert [d.name for d in on_cxl] == ["dax0.0"] and on_cxl[0].target_node == 2


def test_a_case_past_the_device_dax_end_is_refused_naming_its_size(guest):
    # mmap does not refuse a mapping past a device-dax's end: its first touch there is a SIGBUS
    from nearlocal.regions import capacity_problem, parse_region

    pool = parse_region("devdax:/dev/dax1.0")
    assert capacity_problem(pool, 250 << 20) is None
    assert capacity_problem(pool, 300 << 20) == (
        "devdax:/dev/dax1.0 cannot hold 300MiB: dax1.0 (250MiB) has 250MiB free; choose a "
        "smaller size")
    assert "from 2MiB" in capacity_problem(parse_region("devdax:/dev/dax1.0@2MiB"), 249 << 20)
    assert capacity_problem(parse_region("devdax:/dev/dax1.0@2MiB,4MiB"), 8 << 20)


def test_the_ivshmem_bar_and_what_pat_gave_it(guest):
    devices = {d.address: d for d in guest.pci_memory}
    bars = {b.index: b for b in devices[BAR].bars}
    assert set(bars) == {0, 2}
    assert bars[2].prefetchable and bars[2].wc_file and bars[2].size == 1 << 20
    assert not bars[0].prefetchable and not bars[0].wc_file
    assert devices["0000:0d:00.0"].class_code >> 8 == 0x0502  # the CXL type-3 device itself
    root = SysRoot(GUEST)
    assert pat.memtype(root, bars[2].start, 4096) == "write-combining"
    assert "no PAT reservation" in pat.memtype(root, bars[0].start, bars[0].size)  # no driver maps it


def test_pcibar_on_the_guest_tree(guest):
    from nearlocal.regions import attribute_unavailable, parse_region, region_kind

    spec = parse_region(f"pcibar:{BAR}/2")
    region_kind(spec).validate(spec, guest)
    assert attribute_unavailable(spec, "wc") is None
    assert "not prefetchable" in attribute_unavailable(parse_region(f"pcibar:{BAR}/0"), "wc")
    for missing in ("1", "3"):  # unassigned in the guest: not memory, exit 2
        other = parse_region(f"pcibar:{BAR}/{missing}")
        with pytest.raises(UsageError, match="not memory"):
            region_kind(other).validate(other, guest)


def test_uc_on_the_guest_bar_while_wc_holds_it_is_a_disagreement(guest):
    """The recorded list has BAR2 write-combining (x86 PAT allows no uc alias): a uc row taken
    in that state must fail naming both types, never pass as uncached."""
    bar = next(b for d in guest.pci_memory if d.address == BAR for b in d.bars if b.index == 2)
    found = pat.memtype(SysRoot(GUEST), bar.start, 4096)
    problem = pat.disagreement("uc", found, f"{BAR} BAR 2")
    assert problem and "asked uc" in problem and "write-combining" in problem
