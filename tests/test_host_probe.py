"""Host probes (engine/stability/hostprobe.py): every worker process of a multi-process run walks them,
the run keeps their samples, rows say whether a case reaches memory, and `compare` calls a case
slower or faster only beyond the host's own move between the two runs."""

from __future__ import annotations

import json
import math
import multiprocessing

import numpy as np
import pytest

from nearlocal.core.cases import Case
from nearlocal.core.rows import row_facts
from nearlocal.engine.stability import hostprobe
from nearlocal.engine.stability.hostmoves import HostMove, excusing, host_moves, yardsticks
from nearlocal.engine.stability.hostprobe import (
    HOST_PROBES,
    HostProber,
    lay_rings,
    measure_host,
    per_hop_ns,
    probe_facts,
    probe_ring,
    ring_sizes,
)
from nearlocal.frontends.cli import main
from nearlocal.gate.render import render_markdown
from nearlocal.gate.samples import CaseInput, layer_flags
from nearlocal.gate.verdict import compare_runs
from nearlocal.kernels.chase import WORDS_PER_LINE, walk
from nearlocal.store import load
from tests.test_compare_processes import CASES, synthetic_run

MIB = 1 << 20


def code_verdict(moves: list[HostMove], base_row: dict, cand_row: dict, ratio: float,
                 low: float, high: float, threshold: float = 0.05,
                 case_alpha: float = 1e-4) -> str:
    """What code CI makes of a case whose interval [low, high] lies beyond the threshold, the
    host having moved by `moves`: its verdict, or `ambiguous` when a yardstick excuses it."""
    from scipy import stats

    slower = low > 1
    memory, llc = layer_flags(base_row, cand_row)
    case = CaseInput("c", "", 1.0, 1.0, reaches_memory=memory, llc_resident=llc)
    half = math.log(ratio / low if slower else high / ratio)
    z = float(stats.norm.isf(case_alpha / 2))
    if excusing(yardsticks(moves, case), slower, ratio, half, threshold, z):
        return "ambiguous"
    return "slower" if slower else "faster"


def test_a_probe_ring_is_one_cycle_through_every_line():
    _, words = probe_ring(64 << 10)
    lines = words.size // WORDS_PER_LINE
    assert walk(words, 0, lines) == 0
    assert all(walk(words, 0, k) != 0 for k in (1, lines // 2, lines - 1))


def test_a_reading_takes_every_probes_samples_per_hop_and_walks_on():
    rings = lay_rings({"core": 16 << 10, "llc": 256 << 10, "memory": 1 * MIB})
    first = measure_host(rings)
    assert set(first) == set(HOST_PROBES)
    for name, samples in first.items():
        assert len(samples) == HOST_PROBES[name].samples
        assert all(isinstance(s, int) and s > 0 for s in samples)  # raw ticks
    memory = next(ring for ring in rings if ring.probe.name == "memory")
    where = int(memory.position[0])
    measure_host(rings)
    probe = HOST_PROBES["memory"]
    lines = memory.words.size // WORDS_PER_LINE
    hops = (probe.warm_hops(memory.words.nbytes) + probe.hops * probe.samples) % lines
    assert int(memory.position[0]) == walk(memory.words, where, hops)  # it continued the walk


@pytest.mark.parametrize(("llc", "span", "ring"), [
    (0, 0, 64 * MIB),  # nothing known: 64 MiB
    (96 * MIB, 0, 192 * MIB),  # twice the LLC
    (32 * MIB, 256 * MIB, 256 * MIB),  # as wide as the largest memory-bound case
    (32 * MIB, 1 << 30, 1 << 30),
    (32 * MIB, 16 << 30, 1 << 30),  # at most 1 GiB...
    (1 << 30, 0, 2 << 30),  # ...unless the LLC asks for more
])
def test_the_memory_ring_outgrows_the_cache_and_spans_the_largest_memory_case(llc, span, ring):
    assert HOST_PROBES["memory"].ring_bytes(llc, span) == ring
    assert HOST_PROBES["core"].ring_bytes(llc, span) == 16 << 10


def test_the_rings_leave_the_cases_three_quarters_of_the_memory():
    assert ring_sizes(32 * MIB, 1 << 30, 2 << 30)["memory"] == 512 * MIB
    assert ring_sizes(32 * MIB, 1 << 30, 8 << 30)["memory"] == 1 << 30
    assert ring_sizes(32 * MIB, 1 << 30, None)["memory"] == 1 << 30  # MemAvailable unreadable


def _llc(run) -> int:
    return max(c["size_bytes"] for c in run.meta["inventory"]["cpu"]["caches"])


def test_a_run_in_processes_keeps_each_process_host_probe(tmp_path):
    assert main(["run", "--method", "load", "--size", "4KiB", "--processes", "2",
                 "--budget", "0.04", "--quiet", "--out", str(tmp_path)]) == 0
    run = load("latest", tmp_path)
    probes = run.meta["host_probe"]
    assert set(probes["probes"]) == set(HOST_PROBES)
    assert "failure" not in probes
    # 4 KiB of plain loads reach no memory: the memory ring is the floor, over the LLC twice
    llc = _llc(run)
    assert probes["probes"]["memory"]["ring_bytes"] == max(64 * MIB, 2 * llc)
    assert sorted(entry["pass"] for entry in probes["passes"]) == [0, 1]
    for entry in probes["passes"]:
        assert all(len(entry[name]) == HOST_PROBES[name].samples for name in HOST_PROBES)
    # raw ticks kept, with what turns them into ns per hop: the run's TSC rate, the prober's
    # own timer overhead, the hops per sample
    for name, fact in probes["probes"].items():
        assert fact["tsc_hz"] == run.meta["inventory"]["tsc_hz"] and fact["overhead_ticks"] > 0
        assert fact["sample_unit"] == "TSC ticks per sample of `hops` hops"
        ticks = probes["passes"][0][name]
        assert all(isinstance(t, int) for t in ticks)
        ns = per_hop_ns(fact, ticks)
        assert ns[0] == pytest.approx(max(ticks[0] - fact["overhead_ticks"], 0) * 1e9
                                      / fact["tsc_hz"] / fact["hops"])
    json.dumps(run.meta)  # run.json stays plain JSON
    assert bool(run.cases["reaches_memory"].iloc[0]) is False  # 4 KiB of plain loads


def test_the_memory_ring_spans_the_runs_largest_memory_case(tmp_path):
    assert main(["run", "--method", "nt-store", "--size", "96MiB", "--processes", "2",
                 "--budget", "0.02", "--quiet", "--out", str(tmp_path)]) == 0
    run = load("latest", tmp_path)
    probes, llc = run.meta["host_probe"], _llc(run)
    footprint = sum(Case("nt-store", "dram", "wb", "96MiB").spans())  # 96 MiB and a peer line
    assert probes["probes"]["memory"]["ring_bytes"] == max(footprint, 2 * llc)


def test_a_failed_prober_ends_the_probes_not_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(hostprobe, "ring_sizes", lambda llc, span, available: {"core": 0})
    assert main(["run", "--method", "load", "--size", "4KiB", "--processes", "2",
                 "--budget", "0.02", "--quiet", "--out", str(tmp_path)]) == 0
    run = load("latest", tmp_path)
    assert run.cases["status"].tolist() == ["ok"]
    assert run.meta["host_probe"]["passes"] == []
    assert run.meta["host_probe"]["failure"].startswith("the host prober failed laying its rings")


def test_a_prober_that_died_gives_no_reading_and_says_so():
    prober = HostProber(multiprocessing.get_context("forkserver"), {"core": 16 << 10}, 1e9)
    assert len(prober.walk()["core"]) == HOST_PROBES["core"].samples
    prober._process.kill()
    prober._process.join()
    assert prober.walk() is None
    assert prober.failure.startswith("the host prober died")
    prober.close()


def test_a_run_in_one_process_walks_no_probe(tmp_path):
    assert main(["run", "--method", "load", "--size", "4KiB", "--processes", "1",
                 "--budget", "0.02", "--quiet", "--out", str(tmp_path)]) == 0
    assert "host_probe" not in load("latest", tmp_path).meta


@pytest.mark.parametrize(("method", "size", "llc", "reaches"), [
    ("load", "4MiB", 32 * MIB, False),  # cacheable, fits the LLC
    ("load", "64MiB", 32 * MIB, True),  # cacheable, does not fit
    ("chase", "16KiB", 32 * MIB, False),
    ("nt-store", "4KiB", 32 * MIB, True),  # nontemporal: memory whatever the size
    ("clflush-load", "64B", 32 * MIB, True),
    ("memcpy", "16MiB", 24 * MIB, True),  # region and peer: 32 MiB together
    ("memcpy", "4MiB", 24 * MIB, False),
    ("memcpy", "16MiB", 32 * MIB, True),  # 32 MiB together: the whole LLC, none left over
    ("memcpy", "16MiB", 32 * MIB + 64, False),  # a line left over
    ("load", "4KiB", 0, True),  # the LLC unknown: taken as reaching memory
])
def test_a_row_says_whether_its_case_reaches_memory(method, size, llc, reaches):
    assert row_facts(Case(method, "dram", "wb", size), llc_bytes=llc)["reaches_memory"] is reaches


@pytest.mark.parametrize("attr", ["uc", "wc"])
def test_a_case_in_a_mapping_that_bypasses_the_caches_reaches_memory(attr):
    """A plain load of 4 MiB lives in a 32 MiB L3 when write-back; uncacheable or
    write-combining, every access goes to memory (seen: a default run's uc and wc rows said
    llc_resident)."""
    row = row_facts(Case("load", "dram", attr, "4MiB"), llc_bytes=32 * MIB, l2_bytes=512 << 10)
    assert row["reaches_memory"] is True
    assert row["llc_resident"] is False


@pytest.mark.parametrize(("method", "size", "l2", "resident"), [
    ("chase", "4MiB", 512 << 10, True),  # over the 512 KiB L2, within the 32 MiB L3
    ("load", "16MiB", 512 << 10, True),
    ("chase", "256KiB", 512 << 10, False),  # fits the L2
    ("chase", "64MiB", 512 << 10, False),  # reaches memory instead
    ("memcpy", "16MiB", 512 << 10, False),  # region and peer fill the whole 32 MiB L3: memory
    ("memcpy", "8MiB", 512 << 10, True),  # 16 MiB together: below the L3
    ("nt-store", "4MiB", 512 << 10, False),  # not cacheable: memory
    ("chase", "4MiB", 0, False),  # the L2 unknown: not said
])
def test_a_row_says_whether_its_case_lives_in_the_llc(method, size, l2, resident):
    row = row_facts(Case(method, "dram", "wb", size), llc_bytes=32 * MIB, l2_bytes=l2)
    assert row["llc_resident"] is resident


def test_the_llc_probe_walks_an_eighth_of_the_llc():
    assert HOST_PROBES["llc"].ring_bytes(32 * MIB, 1 << 30) == 4 * MIB
    assert HOST_PROBES["llc"].ring_bytes(0, 0) == MIB  # the LLC unknown


@pytest.mark.parametrize("llc", [0, 32 * MIB, 64 * MIB, 256 * MIB, 1 << 30])
def test_the_llc_probes_warm_up_walks_its_whole_ring(llc):
    """At least one pass through every line (64 bytes) of the ring, whatever the LLC; 128 Ki
    hops as before while that is one pass or more (rings up to 8 MiB: an LLC up to 64 MiB)."""
    probe = HOST_PROBES["llc"]
    ring = probe.ring_bytes(llc, 1 << 30)
    warm = probe.warm_hops(ring)
    assert warm >= ring // 64
    assert warm == (1 << 17 if llc <= 64 * MIB else ring // 64)  # 256 MiB: 32 MiB, 512 Ki hops


def test_the_core_and_memory_probes_warm_up_as_many_hops_whatever_the_ring():
    for ring in (16 << 10, 64 * MIB, 1 << 30):
        assert HOST_PROBES["core"].warm_hops(ring) == 4096
        assert HOST_PROBES["memory"].warm_hops(ring) == 1 << 16


def test_a_reading_warms_the_llc_ring_through_once_when_it_is_over_8_mib():
    """The walk goes on by the derived warm-up: a 16 MiB ring (a 128 MiB LLC), 256 Ki lines,
    is walked through once untimed and then its samples' hops."""
    rings = lay_rings({"llc": 16 * MIB})
    llc, probe = rings[0], HOST_PROBES["llc"]
    lines = llc.words.size // WORDS_PER_LINE
    assert probe.warm_hops(llc.words.nbytes) == lines == 256 << 10
    measure_host(rings)
    assert int(llc.position[0]) == walk(llc.words, 0, probe.hops * probe.samples % lines)


def test_the_facts_of_a_probe_name_the_unit_of_its_samples():
    """`samples` of a HostProbe is a count; what a stored sample is goes by `sample_unit`."""
    fact = probe_facts({"core": 16 << 10}, 2e9)["core"]
    assert fact["sample_unit"] == "TSC ticks per sample of `hops` hops"
    assert "samples" not in fact
    assert fact["hops"] == HOST_PROBES["core"].hops and fact["tsc_hz"] == 2e9


def test_the_llc_probe_is_the_yardstick_of_the_cases_living_in_the_llc_only():
    """The LLC probe moved 1.6x (another tenant took the shared L3), core and memory not: an
    LLC-resident case 1.3x slower is within that move; an L1-resident one and a memory one, 1.3x,
    stay slower. A row stored before the column is not LLC-resident. A case living in the LLC in
    one run and reaching memory in the other (its span the LLC's whole size: rows stored before
    8f9facd said it lived in the LLC, rows after say it reaches memory) is judged against
    memory, not the LLC."""
    moves = [HostMove("core", "all", 1.6, 1.6, 1.0, 0.98, 1.02, "32/32", 0.008, False),
             HostMove("llc", "llc", 30, 48, 1.6, 1.4, 1.8, "32/32", 0.05, True),
             HostMove("memory", "memory", 300, 300, 1.0, 0.97, 1.03, "32/32", 0.01, False)]
    cases = ("in-llc", "in-l1", "memory", "old-row", "filled-llc")
    rows = {"in-llc": {"reaches_memory": False, "llc_resident": True},
            "in-l1": {"reaches_memory": False, "llc_resident": False},
            "memory": {"reaches_memory": True, "llc_resident": False},
            "old-row": {"reaches_memory": False}}
    base_rows = {**rows, "filled-llc": {"reaches_memory": False, "llc_resident": True}}
    cand_rows = {**rows, "filled-llc": {"reaches_memory": True, "llc_resident": False}}
    verdicts = [code_verdict(moves, base_rows[c], cand_rows[c], 1.3, 1.25, 1.35) for c in cases]
    assert verdicts == ["ambiguous", "slower", "slower", "slower", "slower"]


def _probed(run, core: float, memory: float, seed: int, passes: int = 32):
    """`run` with host probe samples: per process 15 samples around `core` and `memory` ns."""
    rng = np.random.default_rng(seed)
    run.meta["host_probe"] = {
        "probes": {name: {"bounds": probe.bounds} for name, probe in HOST_PROBES.items()},
        "passes": [{"pass": k,
                    "core": list(core * rng.lognormal(0, 0.02, 15)),
                    "memory": list(memory * rng.lognormal(0, 0.05, 15))} for k in range(passes)]}
    return run


def _reaching(run, memory_cases: set[str]):
    run.cases["reaches_memory"] = [cid in memory_cases for cid in run.cases["case_id"]]
    return run


def test_host_moves_read_the_probes_ratio_and_whether_it_moved():
    base = _probed(synthetic_run(1), 1.2, 200.0, seed=1)
    cand = _probed(synthetic_run(2), 1.2, 260.0, seed=2)
    moves = {m.probe: m for m in host_moves(base.meta, cand.meta, 0.01)}
    assert moves["core"].ratio == pytest.approx(1.0, abs=0.02) and not moves["core"].moved
    assert moves["memory"].ratio == pytest.approx(1.3, rel=0.03) and moves["memory"].moved
    assert moves["memory"].low < moves["memory"].ratio < moves["memory"].high
    assert moves["memory"].passes == "32/32"


def test_runs_without_probes_have_no_host_moves():
    assert host_moves(synthetic_run(1).meta, synthetic_run(2).meta, 0.01) == []
    one = _probed(synthetic_run(1), 1.2, 200.0, seed=1, passes=1)
    assert host_moves(one.meta, one.meta, 0.01) == []


def test_probes_of_another_ring_are_not_set_side_by_side():
    base = _probed(synthetic_run(1), 1.2, 200.0, seed=1)
    cand = _probed(synthetic_run(2), 1.2, 300.0, seed=2)
    for run, ring in ((base, 64 * MIB), (cand, 1 << 30)):  # two plans: another memory span
        run.meta["host_probe"]["probes"]["memory"]["ring_bytes"] = ring
    assert [m.probe for m in host_moves(base.meta, cand.meta, 0.01)] == ["core"]


def test_memory_cases_moving_with_the_hosts_memory_are_ambiguous_not_slower():
    """Unchanged code, the host's memory 1.3x slower in the candidate: the cases that reach
    memory moved with it (1.3x), the cache-resident ones did not. No case is slower; the
    note names the move."""
    memory_cases = {cid for cid in CASES if cid.endswith(("16MiB", "64MiB"))}
    factor = dict.fromkeys(memory_cases, 1.3)
    base = _reaching(_probed(synthetic_run(11, processes=32), 1.2, 200.0, seed=3), memory_cases)
    cand = _reaching(_probed(synthetic_run(12, processes=32, factor=factor), 1.2, 260.0,
                                seed=4), memory_cases)
    result = compare_runs(base, cand)
    assert result.exit_code == 0
    moved = [c for c in result.cases if c.case_id in memory_cases]
    assert all(c.verdict in ("ambiguous", "same") for c in moved)
    assert any(c.note.startswith("with the host's memory move") for c in moved)
    assert result.host_line().startswith("host probes, per hop: core")
    assert "host probes, per hop" in render_markdown(result)
    assert result.to_dict()["host_probes"][1]["probe"] == "memory"


def test_a_slowdown_beyond_the_hosts_move_is_still_slower():
    """The host's memory 1.1x slower; a cache-resident method 1.3x slower (beyond the core
    probe, which held still) and a memory case 1.6x slower (beyond the memory probe's 1.1x)."""
    memory_cases = {cid for cid in CASES if cid.endswith("64MiB")}
    slowed = {cid: 1.3 for cid in CASES if cid.startswith("load/") and cid not in memory_cases}
    slowed["store/dram/wb/64MiB"] = 1.6
    base = _reaching(_probed(synthetic_run(21, processes=32), 1.2, 200.0, seed=5), memory_cases)
    cand = _reaching(_probed(synthetic_run(22, processes=32, factor=slowed), 1.2, 220.0,
                                seed=6), memory_cases)
    result = compare_runs(base, cand)
    verdicts = {c.case_id: c.verdict for c in result.cases}
    assert verdicts["store/dram/wb/64MiB"] == "slower"
    assert verdicts["load/dram/wb/4KiB"] == "slower"


def test_the_memory_probe_is_no_yardstick_for_cache_resident_cases():
    """The memory probe moved 1.5x, the core probe not: a cache-resident case 1.3x slower is
    slower; a case that reaches memory, 1.3x, is within the move. A row stored before the
    column counts as reaching memory."""
    moves = [HostMove("core", "all", 1.2, 1.2, 1.0, 0.98, 1.02, "32/32", 0.008, False),
             HostMove("memory", "memory", 200, 300, 1.5, 1.45, 1.55, "32/32", 0.013, True)]

    rows = [{"reaches_memory": False}, {"reaches_memory": True}, {}]  # cached, memory, old row
    assert [code_verdict(moves, row, row, 1.3, 1.25, 1.35) for row in rows] == \
        ["slower", "ambiguous", "ambiguous"]
    down = [HostMove("memory", "memory", 300, 200, 0.67, 0.64, 0.70, "32/32", 0.017, True)]
    assert code_verdict(down, rows[1], rows[1], 0.7, 0.65, 0.75) == "ambiguous"


@pytest.mark.parametrize(("ratio", "low", "verdict"), [
    (1.5, 1.45, "slower"),  # 1.25x beyond a 1.2x move, by far more than both intervals
    (1.3, 1.25, "ambiguous"),  # 1.08x beyond it: within the intervals' reach of 1.05x
    (1.6, 1.10, "ambiguous"),  # far beyond it, but its own interval reaches back to the move
])
def test_a_case_is_judged_against_the_hosts_move_with_both_uncertainties(ratio, low, verdict):
    """The memory probe moved 1.2x (standard error 2 % of the log): a case stays slower only if
    its ratio over the probe's is beyond the threshold once the case's own half-interval and
    z probe standard errors are added in quadrature."""
    move = [HostMove("memory", "memory", 200, 240, 1.2, 1.12, 1.29, "32/32", 0.02, True)]
    row = {"reaches_memory": True}
    assert code_verdict(move, row, row, ratio, low, 2 * ratio - low, case_alpha=0.01 / 120) == verdict


def test_probe_samples_stored_before_raw_ticks_read_as_ns_per_hop():
    assert per_hop_ns({"hops": 512, "bounds": "memory"}, [210.5, 220.0]) == [210.5, 220.0]
    fact = {"hops": 4, "tsc_hz": 2e9, "overhead_ticks": 20.0}
    assert per_hop_ns(fact, [100, 10]) == [10.0, 0.0]  # (100 - 20) / 2 GHz / 4 hops; never < 0
