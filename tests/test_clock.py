"""One clock per run, read right on every box the project met (tests/fixtures/boxes): the step
from the bulk of the readings whatever the interrupts, the same measurement in every process,
and a report that marks a figure below the clock's step only when it is."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nearlocal.kernels.timer import calibrate, clock_step
from tests.boxes import TRUE_STEPS, Box, comb_trace, fine_trace, recorded_boxes

BOXES = recorded_boxes()


def test_every_box_in_the_fixtures_is_known_and_the_kinds_are_there():
    names = {box.name for box in BOXES}
    assert names <= set(TRUE_STEPS)
    assert {"intel-xeon-m207-kvm-2vcpu", "amd-epyc-kvm-2vcpu", "synthetic-bare-metal"} <= names


@pytest.mark.parametrize("box", BOXES, ids=lambda box: box.name)
def test_the_step_and_overhead_found_are_the_boxs_own_with_interrupts_present(box: Box):
    assert any(run.max() > 50 * np.median(run) for run in box.runs)  # outliers are there
    for run in box.runs:
        clock = calibrate(run)
        assert clock.quantum_ticks == pytest.approx(box.true_step, rel=0.02)
        assert clock.overhead_ticks == np.median(run)  # the bulk's middle, not an outlier's pull
        lo, hi = np.quantile(run, [0.05, 0.95])
        assert lo <= clock.overhead_ticks <= hi
        assert clock.evidence["readings"] == run.size and clock.evidence["bulk_values"]


def test_the_intel_guests_step_is_two_ticks_where_the_old_estimate_read_an_outlier():
    intel = next(box for box in BOXES if box.name.startswith("intel"))
    assert all(int(v) % 2 == 0 for v in np.unique(intel.runs))  # what the trace itself says
    assert {clock_step(run)[0] for run in intel.runs} == {2.0}


@pytest.mark.parametrize("readings,step", [
    (np.array([73, 74, 98, 98, 122, 123, 171, 196] * 50), 24.0),  # a scaled TSC's comb
    (np.arange(30, 41).repeat(20), 1.0),
    (np.array([50] * 400), 1.0),  # nothing tells: the finest step
    (np.array([52] * 900 + [78] * 100 + [104, 338]), 26.0),  # one value in the bulk: gcd
])
def test_clock_step_of_small_traces(readings, step):
    assert clock_step(readings)[0] == pytest.approx(step, abs=0.5)


def test_a_comb_that_jitters_by_a_tick_is_read_as_its_teeth():
    rng = np.random.default_rng(5)
    teeth = 24.4 * rng.integers(2, 6, 20000)
    assert clock_step(np.floor(teeth + rng.random(20000)))[0] == pytest.approx(24.4, rel=0.01)
    dense = np.rint(rng.normal(60, 6, 20000))
    dense = dense[(dense < 58) | (dense > 60)]  # a hole in a 1-tick bulk is no comb
    assert clock_step(dense)[0] == 1.0


# The ranges real boxes show, and the kinds none recorded shows (issue 47). A fine clock: a 1- or
# 2-tick TSC, its empty interval 20-400 ticks in one to three dense runs (two or three paths
# through the fences), each run 6-16 values at the step with 10-60 % of the bulk, one value maybe
# missing from the middle of the first, interrupts 0-5 % of the readings.
FINE_RUN = st.tuples(st.integers(20, 400), st.integers(6, 16), st.floats(0.1, 0.6))


@settings(max_examples=150, deadline=None)
@given(step=st.sampled_from([1, 2]), runs=st.lists(FINE_RUN, min_size=1, max_size=3),
       missing=st.one_of(st.none(), st.integers(2, 3)), outliers=st.floats(0.0, 0.05),
       seed=st.integers(0, 2**32 - 1))
def test_a_fine_clock_is_read_as_its_step_whatever_its_clusters(step, runs, missing, outliers, seed):
    runs = [(first - first % step, length, share) for first, length, share in runs]
    trace = fine_trace(np.random.default_rng(seed), step, runs, missing, outliers)
    assert clock_step(trace)[0] == step


# A scaled TSC (AMD and TCG guests: ~24-26 ticks): a step of 12-40 ticks, maybe fractional, the
# empty interval 1-3 steps at its lowest and 1-4 teeth above it, maybe a tooth at zero (TCG
# reads 1 tick for 0 steps), no jitter, a tick of it, or TCG's; interrupts 0-5 %.
@settings(max_examples=150, deadline=None)
@given(step=st.floats(12.0, 40.0), lowest=st.integers(1, 3), teeth=st.integers(1, 4),
       zero=st.booleans(), jitter=st.sampled_from(["none", "tick", "tcg"]),
       outliers=st.floats(0.0, 0.05), seed=st.integers(0, 2**32 - 1))
def test_a_scaled_clock_is_read_as_its_teeth(step, lowest, teeth, zero, jitter, outliers, seed):
    steps = [*([0] if zero else []), *range(lowest, lowest + teeth)]
    if np.gcd.reduce(np.diff(steps)) != 1:  # one tooth, or 0 and 2 alone: they tell no step
        steps.append(lowest + teeth)
    trace = comb_trace(np.random.default_rng(seed), step, steps, jitter, outliers)
    # readings are whole ticks: a tooth one step out tells the step to within a tick
    assert clock_step(trace)[0] == pytest.approx(step, abs=1.0)


@pytest.mark.parametrize("box", BOXES, ids=lambda box: box.name)
def test_passes_chosen_on_each_box_span_the_clock(box: Box):
    """passes_for on the box's clock, a pass of `body` ticks timed with the box's own noise:
    enough passes for 200 steps where one pass is short, one pass where it is long."""
    from nearlocal.cpu.methods import MIN_SAMPLE_STEPS, passes_for

    clock = calibrate(box.runs[0])
    noise = np.asarray(box.runs[1], np.float64) - clock.overhead_ticks
    rng = np.random.default_rng(1)

    def take_for(body: float):
        def take(ticks: np.ndarray, passes: int) -> None:
            drawn = rng.choice(noise, ticks.size) + clock.overhead_ticks + body * passes
            ticks[:] = np.maximum(np.rint(drawn / clock.quantum_ticks) * clock.quantum_ticks, 0)
        return take

    long_body = 400 * MIN_SAMPLE_STEPS * clock.quantum_ticks
    assert passes_for(take_for(long_body), clock.overhead_ticks, clock.quantum_ticks) == 1
    short = passes_for(take_for(3.0), clock.overhead_ticks, clock.quantum_ticks)
    target = max(MIN_SAMPLE_STEPS * clock.quantum_ticks, 20 * clock.overhead_ticks)
    assert short & (short - 1) == 0 and short * 3.0 >= 0.5 * target


@pytest.mark.parametrize("box", BOXES, ids=lambda box: box.name)
def test_the_report_marks_a_figure_below_the_step_only_when_it_is(box: Box):
    from nearlocal.report.document import Stat
    from nearlocal.report.fmt import _time

    step_ns = calibrate(box.runs[0]).step_ns(box.tsc_hz)
    above = Stat(598.0, 560.0, 640.0, True, step_ns)  # B7's nt-store 16 KiB, isolated
    assert "<" not in _time(above)
    below = Stat(step_ns * 0.4, step_ns * 0.2, step_ns * 0.9, True, step_ns)
    assert _time(below).startswith("<")
    ten_steps = Stat(12 * step_ns, 10.5 * step_ns, 15 * step_ns, True, step_ns)
    assert "<" not in _time(ten_steps)


def test_a_run_has_one_clock_and_every_process_measures_the_same_thing(tmp_path):
    """A real run of 3 processes: run.json keeps the clock with its evidence; every row states
    the run's step; a batched case's processes all hold the passes its first chose (raw ticks
    less the subtracted overheads over ns is one constant); an isolated transfer is never
    batched."""
    from nearlocal.frontends.cli import main
    from nearlocal.store import load

    out = tmp_path / "store"
    assert main(["run", "--method", "load", "--method", "nt-store", "--size", "64B",
                 "--size", "16KiB", "--processes", "3", "--budget", "0.06", "--out", str(out),
                 "--quiet"]) == 0
    run = load(next(out.iterdir()))
    clock = run.meta["clock"]
    assert clock["quantum_ticks"] >= 1 and clock["evidence"]["quantiles"]
    assert np.allclose(run.cases["clock_resolution_ns"], clock["step_ns"])
    assert (run.cases["sample_steps"] > 0).all()
    nt = run.cases[run.cases["method"] == "nt-store"]
    assert set(nt["ops_per_sample"]) == {1}  # drain=before: isolated, however short
    for _, row in run.cases.iterrows():
        info = row["info"] if isinstance(row["info"], dict) else json.loads(row["info"])
        assert info["passes_per_sample"] == row["ops_per_sample"]
        samples = run.samples[(run.samples["case_id"] == row["case_id"]) & (run.samples["ns"] > 0)]
        removed = clock["overhead_ticks"] + info["drain_overhead_ticks"]
        scale = (samples["raw"] - removed) / samples["ns"]
        per_process = scale.groupby(samples["process"]).median()
        assert len(per_process) == 3
        assert per_process.max() / per_process.min() == pytest.approx(1.0, abs=0.01)
        assert per_process.iloc[0] == pytest.approx(
            row["ops_per_sample"] * clock["tsc_hz"] / 1e9, rel=0.01)
