"""The LLC a process can use where cpuid cannot be trusted (a VM): read from a chase curve."""

from __future__ import annotations

import pytest

from nearlocal.probe import cache

MIB = 1 << 20


@pytest.mark.parametrize("spans_mib,ns,l2,expected_mib", [
    ([4, 8, 16, 32, 512], [40, 45, 60, 150, 160], 2 * MIB, 16),  # Intel guest: cpuid 260 MiB
    ([2, 4, 8, 64], [16, 17, 137, 176], MIB, 4),  # the AMD development VM
    ([2, 64], [140, 170], MIB, 1),  # a co-tenant holds the whole L3: the L2 is what is left
    ([2, 4, 8, 16, 64], [15, 16, 18, 20, 150], MIB, None),  # cached up to memory: cpuid stands
])
def test_usable_llc_is_the_last_span_twice_as_fast_as_memory(spans_mib, ns, l2, expected_mib):
    found = cache.usable_llc([s * MIB for s in spans_mib], ns, l2)
    assert found == (expected_mib * MIB if expected_mib else None)


def test_the_curve_stops_at_the_first_span_in_memory_and_ends_with_the_reference(monkeypatch):
    walked = []

    def fake(span: int, tsc_hz: float) -> float:
        walked.append(span)
        return 20.0 if span <= 8 * MIB else 150.0

    monkeypatch.setattr(cache, "_ns_per_hop", fake)
    spans, ns = cache.chase_curve(MIB, 260 * MIB, 2e9, available=64 << 30)
    assert spans == [2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 520 * MIB]
    assert walked[0] == 520 * MIB and ns[-1] == 150.0  # the memory reference first
    assert cache.usable_llc(spans, ns, MIB) == 8 * MIB


def test_the_reference_ring_fits_the_memory_available():
    assert cache.memory_span(260 * MIB, None) == 520 * MIB
    assert cache.memory_span(260 * MIB, 1 << 30) <= (1 << 30) * cache.MEMORY_SHARE
    assert cache.memory_span(8 * MIB, None) == 64 * MIB


def test_a_fake_trees_probe_keeps_cpuids_llc_even_when_it_says_hypervisor(tmp_path, monkeypatch):
    """Only this machine is walked: a recorded tree's cpuid figure is what it says."""
    from nearlocal.probe import probe
    from nearlocal.sysroot import SysRoot
    from tests.fakesys import CPUINFO, cxl_box

    monkeypatch.setattr(cache, "_ns_per_hop", lambda span, hz: pytest.fail("walked a fake tree"))
    root = cxl_box(tmp_path, cpuinfo=CPUINFO.replace("flags\t\t: ", "flags\t\t: hypervisor "))
    cpu = probe(SysRoot(root), gpu=False).cpu
    assert cpu.has("hypervisor")
    assert cpu.llc_bytes == cpu.cpuid_llc_bytes == 107520 * 1024 and cpu.llc_source == "cpuid"
