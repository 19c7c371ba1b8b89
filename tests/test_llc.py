"""The LLC a process can use where cpuid cannot be trusted (a VM): read from a chase curve."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# --- cache classes that hold between runs (store/boxes.py, engine.plan.settle_llc) -------------

def test_the_store_holds_the_llc_its_cases_are_classified_by(tmp_path):
    from nearlocal.store.boxes import keep_llc, llc_file, settled_llc

    def settle(box: str, reading: int) -> tuple[int, str]:
        llc, how, records = settled_llc(tmp_path, box, reading)
        keep_llc(tmp_path, records)
        return llc, how

    assert settle("vm", 4 * MIB)[0] == 4 * MIB  # the first reading
    llc, how = settle("vm", 8 * MIB)  # within 2x: held
    assert llc == 4 * MIB and how.startswith("held") and "4, 8" in how
    assert settle("vm", 2 * MIB)[0] == 4 * MIB
    assert settle("other", 2 * MIB)[0] == 2 * MIB  # another box its own
    llc, how = settle("vm", 32 * MIB)  # left the band: the largest kept
    assert llc == 32 * MIB and how.startswith("moved")
    llc_file(tmp_path).write_text("{not json")  # damaged: begins again, says nothing wrong
    assert settle("vm", 8 * MIB)[0] == 8 * MIB
    settled_llc(tmp_path, "vm", 64 * MIB)  # not kept: a refused run leaves the store alone
    assert settle("vm", 8 * MIB)[0] == 8 * MIB


@settings(max_examples=200, deadline=None)
@given(first=st.sampled_from([1, 2, 4, 8, 16, 32]),
       moves=st.lists(st.floats(0.5, 2.0), min_size=1, max_size=12))
def test_readings_within_the_band_never_reclassify(tmp_path_factory, first, moves):
    """However the probe moves within 2x of the LLC held, the LLC held does not move."""
    from nearlocal.store.boxes import keep_llc, settled_llc

    root = tmp_path_factory.mktemp("store")
    held, _, records = settled_llc(root, "vm", first * MIB)
    keep_llc(root, records)
    for move in moves:
        llc, _, records = settled_llc(root, "vm", int(first * MIB * move))
        keep_llc(root, records)
        assert llc == held


def test_two_runs_whose_probes_read_4_and_8_mib_classify_every_case_alike(tmp_path, monkeypatch):
    """The development VM's probe read 2, 4 and 8 MiB on one day: the quick suite's rows keep
    their llc_resident / reaches_memory between two such runs in one store."""
    from dataclasses import replace

    from nearlocal.core.suites import suite_cases
    from nearlocal.engine.plan import plan_entries, settle_llc
    from nearlocal.probe import probe

    box = probe(calibrate=False, gpu=False)
    classes = []
    for reading in (4 * MIB, 8 * MIB):
        inventory = replace(box, cpu=replace(box.cpu, measured_llc_bytes=reading))
        settled, keep = settle_llc(inventory, tmp_path)
        keep()
        assert "cases classified by 4 MiB" in settled.cpu.llc_source
        classes.append({entry.case.id: (entry.row.get("llc_resident"), entry.row.get("reaches_memory"))
                        for entry in plan_entries(suite_cases("quick", settled), settled)})
    assert classes[0] == classes[1] and any(llc for llc, _ in classes[0].values())
    raw = [{entry.case.id: entry.row.get("reaches_memory") for entry in plan_entries(
        suite_cases("quick", inventory), inventory)} for inventory in (
        replace(box, cpu=replace(box.cpu, measured_llc_bytes=r)) for r in (4 * MIB, 8 * MIB))]
    assert raw[0] != raw[1]  # each run's own probe would have re-classified the 4 MiB cases
