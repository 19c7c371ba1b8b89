"""The LLC a process can use where cpuid cannot be trusted (a VM): read from a chase curve."""

from __future__ import annotations

import functools

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

@functools.cache
def _probed():
    from nearlocal.probe import probe

    return probe(calibrate=False, gpu=False)


def _box(reading: int):
    """This box as probed, its VM probe reading `reading` bytes of usable LLC."""
    from dataclasses import replace

    box = _probed()
    return replace(box, cpu=replace(box.cpu, measured_llc_bytes=reading))


def _stored(root, inventory, n: int) -> None:
    """A run of the store, as far as the next run's settle_llc reads it: its run.json."""
    import json

    run = root / f"20261204T2100{n:02d}-abcdef"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"inventory": inventory.to_dict()}))


def test_a_run_classifies_by_the_llc_the_boxs_latest_run_held(tmp_path):
    from nearlocal.engine.plan import settle_llc

    held = []
    for n, mib in enumerate([4, 8, 2, 32, 16]):
        settled = settle_llc(_box(mib * MIB), tmp_path)
        held.append(settled.cpu.measured_llc_bytes // MIB)
        _stored(tmp_path, settled, n)
    # 8 and 2 lie within 2x of the 4 held; 32 leaves the band (the largest kept); 16 is within
    assert held == [4, 4, 4, 32, 32]
    assert settled.cpu.llc_readings == [m * MIB for m in (4, 8, 2, 32, 16)]
    assert "held: this run's 16 MiB" in settled.cpu.llc_source
    (tmp_path / "20261204T210099-ffffff").mkdir()  # a damaged run (no readable run.json) is
    (tmp_path / "20261204T210099-ffffff" / "run.json").write_text("{not json")  # no evidence
    assert settle_llc(_box(16 * MIB), tmp_path).cpu.measured_llc_bytes == 32 * MIB
    other = settle_llc(_box(2 * MIB), tmp_path / "another-store")  # no run of it: its own probe
    assert other.cpu.measured_llc_bytes == 2 * MIB and "no earlier run" in other.cpu.llc_source


def test_an_mpi_jobs_ranks_hold_their_own_boxs_llc_from_rank_0s_store(tmp_path):
    """A rank on another host has no store: rank 0 reads every host's held LLC from its own
    (`host_inventories` of the latest MPI run) and each rank settles its box by it."""
    import json
    from dataclasses import replace

    from nearlocal.engine.plan import settle_llc
    from nearlocal.store.boxes import held_llcs

    here = settle_llc(_box(8 * MIB), tmp_path)
    there = replace(here, hostname="another-host")
    there = replace(there, cpu=replace(there.cpu, measured_llc_bytes=32 * MIB,
                                       llc_readings=[32 * MIB]))
    run = tmp_path / "20261204T210001-abcdef"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"inventory": here.to_dict(), "host_inventories": {
        "0": here.to_dict(), "1": there.to_dict()}}))
    held = json.loads(json.dumps(held_llcs(tmp_path)))  # as sent: plain data
    rank1 = replace(_box(20 * MIB), hostname="another-host")
    assert settle_llc(rank1, held).cpu.measured_llc_bytes == 32 * MIB  # held, not its 20
    assert settle_llc(_box(6 * MIB), held).cpu.measured_llc_bytes == 8 * MIB
    assert settle_llc(_box(6 * MIB), {}).cpu.measured_llc_bytes == 6 * MIB  # no store


@settings(max_examples=100, deadline=None)
@given(first=st.sampled_from([1, 2, 4, 8, 16, 32]),
       moves=st.lists(st.floats(0.5, 2.0), min_size=1, max_size=8))
def test_readings_within_the_band_never_reclassify(tmp_path_factory, first, moves):
    """However the probe moves within 2x of the LLC held, the LLC held does not move."""
    from nearlocal.engine.plan import settle_llc

    root = tmp_path_factory.mktemp("store")
    settled = settle_llc(_box(first * MIB), root)
    _stored(root, settled, 0)
    for n, move in enumerate(moves, 1):
        again = settle_llc(_box(int(first * MIB * move)), root)
        assert again.cpu.measured_llc_bytes == first * MIB
        _stored(root, again, n)


def test_two_runs_whose_probes_read_4_and_8_mib_classify_every_case_alike(tmp_path):
    """The development VM's probe read 2, 4 and 8 MiB on one day: the quick suite's rows keep
    their llc_resident / reaches_memory between two such runs in one store, where each run's own
    probe would have re-classified the 4 MiB cases."""
    from nearlocal.core.suites import suite_cases
    from nearlocal.engine.plan import plan_entries, settle_llc

    def classes(inventory) -> dict:
        return {entry.case.id: (entry.row.get("llc_resident"), entry.row.get("reaches_memory"))
                for entry in plan_entries(suite_cases("quick", inventory), inventory)}

    settled = []
    for n, reading in enumerate((4 * MIB, 8 * MIB)):
        settled.append(settle_llc(_box(reading), tmp_path))
        _stored(tmp_path, settled[-1], n)
    assert classes(settled[0]) == classes(settled[1])
    assert any(llc for llc, _ in classes(settled[0]).values())
    assert classes(_box(4 * MIB)) != classes(_box(8 * MIB))
