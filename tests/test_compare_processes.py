"""`nearlocal compare` on runs measured in several worker processes (`run --processes K`): the
noise model fitted on the runs' own repeats must stay quiet when the code did not change and catch
a uniform 1.3x slowdown, on synthetic runs whose process-to-process spread is as large as a busy
2-vCPU VM's (a few % to 25% per case)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from nearlocal.engine.processes import default_processes
from nearlocal.frontends.cli import main
from nearlocal.gate.verdict import benjamini_hochberg, compare_runs
from nearlocal.store import load
from nearlocal.store.reader import RunData

METHODS = ("load", "store", "nt-store")
SIZES = ("4KiB", "16KiB", "64KiB", "256KiB", "1MiB", "4MiB", "16MiB", "64MiB")
CASES = [f"{m}/dram/wb/{s}" for m in METHODS for s in SIZES]


def _levels(seed: int = 0) -> dict[str, tuple[float, float]]:
    """Per case: (typical median ns, sigma of one process's log median), fixed for all runs.
    Sigmas are log-uniform between 1% and 25%, as measured between processes on the busy VM."""
    rng = np.random.default_rng(seed)
    return {cid: (1e3 * 4 ** (i % len(SIZES)), float(math.exp(rng.uniform(math.log(0.01),
                                                                             math.log(0.25)))))
            for i, cid in enumerate(CASES)}


def synthetic_run(seed: int, processes: int = 5, factor: float | dict[str, float] = 1.0,
                  levels: dict | None = None, run_sigma: float = 0.0, n: int = 200) -> RunData:
    """A run as the store loads it: per case, `processes` groups of n samples, each group's level
    drawn around the case's median with the case's process sigma (and, with run_sigma, one more
    draw per case and run that no process shows)."""
    rng = np.random.default_rng(seed)
    samples = {}
    for cid, (median, sigma) in (levels or _levels()).items():
        scale = factor if isinstance(factor, float) else factor.get(cid, 1.0)
        run_level = median * scale * rng.lognormal(0, run_sigma) if run_sigma else median * scale
        samples[cid] = np.concatenate([run_level * rng.lognormal(0, sigma)
                                       * rng.lognormal(0, 0.02, n) for _ in range(processes)])
    return _run_data({"run_id": f"run-{seed}", "host_id": "h"}, samples, processes, n)


def _run_data(meta: dict, samples: dict[str, np.ndarray], processes: int, n: int) -> RunData:
    """The run as the store loads it, from each case's samples (`processes` groups of n)."""
    rows, frames = [], []
    for cid, ns in samples.items():
        frames.append(pd.DataFrame({"case_id": cid, "rep": np.arange(ns.size), "raw": ns,
                                    "ns": ns, "process": np.repeat(np.arange(processes), n)}))
        rows.append({"case_id": cid, "method": cid.split("/")[0], "status": "ok",
                     "median_ns": float(np.median(ns)), "converged": True,
                     "timer_overhead_ns": 20.0, "clock_resolution_ns": 10.0,
                     "processes": processes})
    return RunData(Path(f"/nonexistent/{meta['run_id']}"), meta, pd.DataFrame(rows),
                   pd.concat(frames, ignore_index=True))


def test_same_code_reruns_stay_quiet():
    """40 pairs of runs of the same code: a false `slower` in any case of a pair may happen with
    probability alpha = 1% per pair; here none does, and most cases are not judged at all."""
    alarms = []
    for pair in range(40):
        result = compare_runs(synthetic_run(2 * pair), synthetic_run(2 * pair + 1))
        assert all(c.processes == "5/5" for c in result.cases)
        alarms.append(result.exit_code)
    assert sum(alarms) == 0


def test_a_uniform_1_3x_slowdown_is_caught_in_every_pair():
    for pair in range(20):
        result = compare_runs(synthetic_run(100 + 2 * pair),
                              synthetic_run(101 + 2 * pair, factor=1.3))
        assert result.exit_code == 1
        counts = result.counts()
        assert counts["faster"] == 0
        # the quiet cases (process sigma under 5%) are all caught
        quiet = [c for c in result.cases if _levels()[c.case_id][1] < 0.05]
        assert all(c.verdict == "slower" for c in quiet), [c.case_id for c in quiet
                                                            if c.verdict != "slower"]


def test_one_method_slower_is_flagged_and_nothing_else():
    """Every store case 1.5x slower: flagged in (nearly) every pair, and never another case."""
    slower = {cid: 1.5 for cid in CASES if cid.startswith("store/")}
    caught = 0
    for pair in range(10):
        result = compare_runs(synthetic_run(200 + 2 * pair), synthetic_run(201 + 2 * pair,
                                                                           factor=slower))
        flagged = {c.case_id for c in result.cases if c.verdict == "slower"}
        assert flagged <= set(slower)
        assert not any(c.verdict == "faster" for c in result.cases)
        caught += result.exit_code
    assert caught >= 9


def test_fewer_than_two_processes_fall_back_to_the_whole_run_model():
    result = compare_runs(synthetic_run(1, processes=1), synthetic_run(2, processes=5))
    assert all(c.processes == "" and c.detail["unit"] == "samples" for c in result.cases)


def test_ratio_and_interval_are_of_the_process_medians():
    base, cand = synthetic_run(7), synthetic_run(8, factor=1.3)
    result = compare_runs(base, cand)
    case = next(c for c in result.cases if c.case_id == CASES[0])
    logs = {name: run.samples[run.samples["case_id"] == CASES[0]].groupby("process")["ns"]
            .median().map(math.log).mean() for name, run in (("b", base), ("c", cand))}
    assert case.base_median_ns == pytest.approx(math.exp(logs["b"]))
    assert case.ratio == pytest.approx(math.exp(logs["c"] - logs["b"]))
    assert case.ci_low < case.ratio < case.ci_high
    assert case.processes == "5/5"


def test_benjamini_hochberg_matches_the_step_up_rule():
    rng = np.random.default_rng(1)
    p = np.concatenate([rng.uniform(0, 1e-3, 5), rng.uniform(0, 1, 45)])
    adjusted = benjamini_hochberg(p, 60)
    order = np.sort(p)
    ranks = np.nonzero(order <= np.arange(1, p.size + 1) * 0.05 / 60)[0]
    expected = int(ranks[-1]) + 1 if ranks.size else 0
    assert int(np.sum(adjusted <= 0.05)) == expected
    assert np.all(adjusted >= p) and np.all(adjusted <= 1)
    # scipy's own BH (family = the p-values given) agrees
    assert np.allclose(benjamini_hochberg(p, p.size), scipy_stats.false_discovery_control(p))


def test_default_processes_follow_the_budget():
    assert [default_processes(b) for b in (0.01, 0.02, 0.1, 0.3, 0.5, 2.0)] == [1, 1, 6, 20, 32, 32]


def test_run_with_processes_tags_every_sample(tmp_path):
    """A real run: 2 worker processes per case drawing 3 placements each, the samples of each
    tagged by process and placement, the row pooling all six, the gate's unit the process (the
    mean of its placements' log medians), the placements behind it said."""
    assert main(["run", "--method", "load", "--method", "store", "--size", "4KiB",
                 "--processes", "2", "--placements", "3", "--budget", "0.06", "--quiet",
                 "--out", str(tmp_path)]) == 0
    run = load("latest", tmp_path)
    assert run.meta["processes"] == 2
    for row in run.cases.to_dict("records"):
        samples = run.samples[run.samples["case_id"] == row["case_id"]]
        assert set(samples["process"]) == {0, 1}
        pairs = set(zip(samples["process"], samples["placement"], strict=True))
        assert pairs == {(0, 0), (0, 1), (0, 2), (1, 3), (1, 4), (1, 5)}
        assert row["processes"] == 2 and row["placements"] == 6
        assert row["n_samples"] == len(samples)
        assert row["median_ns"] == pytest.approx(float(np.median(samples["ns"])))
        facts = row["info"]["placements"]  # what each placement could see, named by process
        assert [(f["process"], f["placement"]) for f in facts] == [(k, p) for k in (0, 1)
                                                                  for p in range(3)]
        assert all(f["region_offset"] is not None and f["median_ns"] > 0 for f in facts)
    result = compare_runs(run, run)
    assert all(c.processes == "2/2" and c.placements == "6/6" for c in result.cases)
    assert result.exit_code == 0


def test_bad_process_count_is_a_usage_error(tmp_path, capsys):
    assert main(["run", "--method", "load", "--processes", "0", "--out", str(tmp_path)]) == 2
    assert "--processes" in capsys.readouterr().err


def test_runs_stored_before_process_tags_load_with_process_0(tmp_path):
    run = synthetic_run(1, processes=1)
    from nearlocal.store import Store

    store = Store.create(tmp_path, {"host_id": "h"})
    for row in run.cases.to_dict("records"):
        ns = run.samples_of(row["case_id"])
        store.add_case(row, ns, ns)
    path = store.finish()
    old = pd.read_parquet(path / "samples.parquet").drop(columns="process")
    old.to_parquet(path / "samples.parquet")  # as schema version 1 wrote it
    loaded = load(path)
    assert (loaded.samples["process"] == 0).all()
    assert all(c.detail["unit"] == "samples" for c in compare_runs(loaded, loaded).cases)


# A test double loaded by the test and, through NEARLOCAL_PLUGINS, by every worker process: its
# session "measures" 1 us and, at the case's second opening (the second worker process), raises or
# kills its process, as the case's `fail` parameter says (or, with fail=spread, reads 1.5x in every
# other process).
FLAKY_METHOD = '''
import os
import signal
from pathlib import Path

import numpy as np

from nearlocal.core.methods import Method, register_method


class FlakySession:
    clock = "fake"

    def __init__(self, ctx):
        self.info = {}
        mode = ctx.params.get("fail", "never")
        opened = Path(os.environ["I12C_FLAKY_DIR"]) / mode
        opened.mkdir(exist_ok=True)
        count = len(list(opened.iterdir()))
        (opened / str(count)).touch()
        if count == 1 and mode == "raise":
            raise RuntimeError("flaky method failed")
        if count == 1 and mode == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        # fail=spread: never fails, but every other process reads 1.5x (a busy host's draw)
        self.level = 1500.0 if mode == "spread" and count % 2 else 1000.0

    def sample(self, n):
        ns = np.full(n, self.level)
        return ns.copy(), ns

    def close(self):
        pass


register_method(Method(name="i12c-flaky", marker="cpu", summary="test double", accesses=("read",),
                       state="-", cacheable=False, open_session=FlakySession, params={"fail": "never"}))
'''


@pytest.fixture
def flaky_method(tmp_path, monkeypatch):
    import importlib
    import sys

    from nearlocal.core.methods import METHODS, load_methods

    (tmp_path / "i12c_flaky_method.py").write_text(FLAKY_METHOD)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("NEARLOCAL_PLUGINS", "i12c_flaky_method")
    monkeypatch.setenv("I12C_FLAKY_DIR", str(tmp_path / "opened"))
    (tmp_path / "opened").mkdir()
    load_methods()
    importlib.import_module("i12c_flaky_method")
    yield
    METHODS.pop("i12c-flaky", None)
    sys.modules.pop("i12c_flaky_method", None)


def _run(runner, cases: list) -> list[dict]:
    """The cases checked and resolved once, as a plan does, then run."""
    from nearlocal.engine.plan import plan_entries

    return runner.run(plan_entries(cases, runner.inventory))


def _runner(tmp_path, processes, **kwargs):
    from nearlocal.core.sampling import StoppingRule
    from nearlocal.engine.runner import Runner
    from nearlocal.engine.worker import WorkerSettings
    from nearlocal.probe import probe
    from nearlocal.store import Store

    inventory = probe(gpu=False)
    # one placement a process: these tests count a method's openings per process
    settings = WorkerSettings(StoppingRule(budget_s=0.03, min_samples=5), inventory.tsc_hz, False,
                              placements=1)
    store = Store.create(tmp_path / "store", {"host_id": inventory.host_id})
    return Runner(inventory, settings, store, processes=processes, **kwargs), store


def test_a_case_failing_in_a_later_process_fails_and_the_others_go_on(tmp_path, flaky_method):
    from nearlocal.core.cases import Case

    cases = [Case("i12c-flaky", "dram", "wb", "4KiB", params=(("fail", mode),))
             for mode in ("raise", "crash", "never")]
    runner, store = _runner(tmp_path, 3)
    rows = {row["case_id"]: row for row in _run(runner, cases)}
    run = load(store.finish())
    raised, crashed, fine = (rows[case.id] for case in cases)  # fail=never, the default: no param
    assert raised["status"] == "failed" and "flaky method failed (process 2 of 3)" in raised["reason"]
    assert crashed["status"] == "failed" and crashed["reason"] == "worker crashed: SIGSEGV (process 2 of 3)"
    assert fine["status"] == "ok" and fine["processes"] == 3
    by_case = run.samples.groupby("case_id")["process"].unique()
    assert list(by_case.index) == [fine["case_id"]]  # failed cases keep no samples
    assert sorted(by_case.iloc[0]) == [0, 1, 2]


def test_an_interrupted_run_stores_the_processes_measured_so_far(tmp_path, flaky_method):
    from nearlocal.core.cases import Case

    def stop(index: int) -> None:
        if index == 2:
            raise KeyboardInterrupt

    runner, store = _runner(tmp_path, 3, events=_Events(new_pass=stop))
    with pytest.raises(KeyboardInterrupt):
        _run(runner, [Case("i12c-flaky", "dram", "wb", "4KiB")])
    run = load(store.finish())
    (row,) = run.cases.to_dict("records")
    assert row["status"] == "ok" and row["processes"] == 2
    assert sorted(run.samples["process"].unique()) == [0, 1]


def test_a_pooled_row_is_converged_when_its_pooled_samples_meet_the_rule():
    from nearlocal.core.sampling import StoppingRule
    from nearlocal.engine.pooling import _pooled

    rng = np.random.default_rng(3)
    rule = StoppingRule(budget_s=0.5, target_rel_ci=0.01, min_samples=30)
    # each process alone has too few samples for the rule; together they settle the median
    results = [({"converged": False, "timer_overhead_ns": 20.0, "clock_resolution_ns": 1.0},
                np.zeros(20), 100 + rng.normal(0, 1, 20), np.zeros(20, np.int32)) for _ in range(16)]
    row = _pooled(*_stacked(results), 64, rule)
    assert row["converged"] is True and row["processes_converged"] == 0 and row["processes"] == 16
    noisy = [({"converged": True}, np.zeros(40), 100 * rng.lognormal(0, 0.5, 40), np.zeros(40, np.int32))
             for _ in range(2)]
    assert _pooled(*_stacked(noisy), 64, rule)["converged"] is False


def _stacked(results: list[tuple]) -> tuple:
    """Per-process (row, raw, ns, placement) results as _pooled takes them: the rows, all ns,
    and each sample's placement numbered across processes (engine.pooling.global_placements)."""
    from nearlocal.engine.pooling import global_placements

    return ([r for r, _, _, _ in results], np.concatenate([n for _, _, n, _ in results]),
            global_placements([p for _, _, _, p in results]))


def test_trimmed_location_is_yuens_and_ignores_one_busy_process():
    from nearlocal.core.sampling import PROCESS_TRIM, trimmed_location

    rng = np.random.default_rng(5)
    a, b = rng.normal(5.0, 0.05, 32), rng.normal(5.1, 0.08, 32)
    (mean_a, var_a, h_a), (mean_b, var_b, h_b) = trimmed_location(a), trimmed_location(b)
    assert h_a == h_b == 32 - 2 * int(PROCESS_TRIM * 32)
    assert mean_a == pytest.approx(scipy_stats.trim_mean(a, PROCESS_TRIM))
    yuen = scipy_stats.ttest_ind(b, a, trim=PROCESS_TRIM, equal_var=False)
    assert (mean_b - mean_a) / np.sqrt(var_a / h_a + var_b / h_b) == pytest.approx(yuen.statistic)
    busy = a.copy()
    busy[0] = 5.0 + np.log(3.0)  # one process on a busy host, 3x slower
    assert trimmed_location(busy)[0] == pytest.approx(mean_a, abs=0.01)


def test_a_case_whose_processes_disagree_gets_more_of_them(tmp_path, flaky_method):
    from nearlocal.core.cases import Case

    spread, steady = (Case("i12c-flaky", "dram", "wb", "4KiB", params=(("fail", mode),))
                      for mode in ("spread", "never"))
    settled = []
    runner, store = _runner(tmp_path, 4, max_processes=12,
                            events=_Events(settle=lambda case_id, extra: settled.append(
                                (case_id, extra))))
    rows = {row["case_id"]: row for row in _run(runner, [spread, steady])}
    run = load(store.finish())
    assert rows[spread.id]["processes"] == 12 and rows[steady.id]["processes"] == 4
    assert settled == [(spread.id, 8)]
    tags = run.samples.groupby("case_id")["process"].unique()
    assert sorted(tags[spread.id]) == list(range(12)) and sorted(tags[steady.id]) == [0, 1, 2, 3]
    # each process was a worker of its own: the double counted its openings
    assert len(list((tmp_path / "opened" / "spread").iterdir())) == 12


def test_how_many_processes_a_case_needs():
    from nearlocal.core.sampling import SETTLED_SPREAD
    from nearlocal.core.sampling import log_spread as process_spread
    from nearlocal.engine.processes import processes_to_settle

    def processes(levels):
        return [np.full(50, level) for level in levels]

    calm = processes(1000 * np.exp(np.linspace(-0.05, 0.05, 8)))
    assert process_spread(calm) < SETTLED_SPREAD and processes_to_settle(calm, 8, 32) == 8
    one_busy = processes([1000.0] * 7 + [3000.0])  # one process on a busy host: not a spread
    assert processes_to_settle(one_busy, 8, 32) == 8
    wide = processes(1000 * np.exp(np.linspace(-0.3, 0.3, 8)))
    spread = process_spread(wide)
    assert spread == pytest.approx((np.percentile(np.linspace(-0.3, 0.3, 8), 75)
                                    - np.percentile(np.linspace(-0.3, 0.3, 8), 25)) / 1.349)
    assert processes_to_settle(wide, 8, 1000) == math.ceil(8 * (spread / SETTLED_SPREAD) ** 2)
    assert processes_to_settle(wide, 8, 32) == 32  # at most the cap
    assert processes_to_settle(wide, 8, 8) == 8  # processes given: never more
    assert processes_to_settle(wide[:3], 3, 12) == 3  # too few to tell


@pytest.fixture
def fork_server_started(tmp_path):
    """A run before the test's own: the runner's fork server is up with the environment of then."""
    from nearlocal.core.cases import Case

    runner, store = _runner(tmp_path / "first", 1)
    (row,) = _run(runner, [Case("load", "dram", "wb", "64B")])
    store.finish()
    assert row["status"] == "ok"
    assert row["info"]["peer_bytes"] == 64  # a load's peer, never touched, is one line


def test_a_worker_has_the_environment_of_its_start_not_the_fork_servers(
        tmp_path, fork_server_started, flaky_method):
    """The plugin is named (NEARLOCAL_PLUGINS, sys.path) after the server started."""
    from nearlocal.core.cases import Case

    runner, store = _runner(tmp_path, 2)
    (row,) = _run(runner, [Case("i12c-flaky", "dram", "wb", "4KiB")])
    store.finish()
    assert row["status"] == "ok" and row["processes"] == 2


@pytest.mark.parametrize("processes, advice", [(8, "take turns or more --processes"),
                                               (128, "at the most processes: take turns")])
def test_an_undecided_case_is_told_more_processes_only_where_more_are_to_be_had(processes, advice):
    """A case spread 80 % over processes straddles the threshold; settling gives such a case up to
    128 processes, more than --processes takes (100), and its note then says so instead of asking
    for more."""
    levels = {**{cid: (1e3, 0.02) for cid in CASES}, CASES[0]: (1e3, 0.8)}
    base = synthetic_run(11, processes=processes, levels=levels, n=20)
    cand = synthetic_run(12, processes=processes, levels=levels, n=20)
    case = next(c for c in compare_runs(base, cand).cases if c.case_id == CASES[0])
    assert case.verdict == "ambiguous"
    assert advice in case.note
    assert case.processes == f"{processes}/{processes}"


def turn_taking_runs(seed: int, factor: float, group: str | None = "g1", processes: int = 32,
                     n: int = 50) -> tuple[RunData, RunData]:
    """Two runs that took turns (run --take-turns): in round k both drew the host's state then,
    a two-state shared L3 (the ring held or not: 1x or 3x, in spells) times a drift, while each
    process adds only 3 % of its own. The candidate is `factor` slower."""
    rng = np.random.default_rng(seed)
    runs = []
    levels = _levels()
    host = {cid: np.exp(np.cumsum(rng.normal(0, 0.05, processes)))
            * np.where(np.repeat(rng.random(processes // 8) < 0.4, 8), 3.0, 1.0)
            for cid in levels}
    for arm, scale in enumerate((1.0, factor)):
        samples = {}
        for cid, (median, _) in levels.items():
            medians = median * scale * host[cid] * rng.lognormal(0, 0.03, processes)
            samples[cid] = np.concatenate([m * rng.lognormal(0, 0.02, n) for m in medians])
        meta = {"run_id": f"turns-{seed}-{arm}", "host_id": "h"}
        if group is not None:
            meta["turns"] = {"group": group, "arm": arm, "arms": 2}
        runs.append(_run_data(meta, samples, processes, n))
    return runs[0], runs[1]


def test_runs_that_took_turns_are_paired_by_round_and_the_hosts_state_cancels():
    """Under a host whose shared state moves each case 1x-3x in spells, two runs that took turns
    catch a 1.3x slowdown in every case and call unchanged code the same; the same samples
    judged unpaired (no common group) cannot tell."""
    base, cand = turn_taking_runs(7, 1.3)
    paired = compare_runs(base, cand)
    assert paired.paired and paired.head_line() == "code CI, paired: the runs took turns"
    assert all(c.detail["unit"] == "pairs" for c in paired.cases)
    assert paired.counts()["slower"] == len(CASES)
    assert all(c.processes == "32/32 (32 paired)" for c in paired.cases)
    assert all(c.cand_median_ns == pytest.approx(c.base_median_ns * c.ratio) for c in paired.cases)
    unpaired = compare_runs(*turn_taking_runs(7, 1.3, group=None))
    assert not unpaired.paired and "unpaired" in unpaired.head_line()
    assert unpaired.counts()["slower"] < len(CASES) / 2
    for seed in range(5):
        same = compare_runs(*turn_taking_runs(20 + seed, 1.0))
        assert same.exit_code == 0 and same.counts()["same"] >= 0.9 * len(CASES)


def test_only_runs_of_one_group_as_different_arms_are_paired():
    from nearlocal.engine.stability.turns import same_group

    arm = {"group": "g1", "arm": 0, "arms": 2}
    assert same_group({"turns": arm}, {"turns": {**arm, "arm": 1}})
    assert not same_group({"turns": arm}, {"turns": arm})  # a run with itself
    assert not same_group({"turns": arm}, {"turns": {**arm, "arm": 1, "group": "g2"}})
    assert not same_group({}, {"turns": arm})
    assert not same_group({"turns": "damaged"}, {"turns": arm})


class _Events:
    """RunEvents with the given methods (a test's hooks); the rest do nothing."""

    def __init__(self, **hooks) -> None:
        from nearlocal.engine.runner import RunEvents

        self._default, self._hooks = RunEvents(), hooks

    def __getattr__(self, name: str):
        return self._hooks.get(name) or getattr(self._default, name)


def test_an_interrupt_that_c_code_cleared_without_a_word_still_stops_the_run(tmp_path, flaky_method):
    """A signal handler's exception that C code cleared (no `Exception ignored`, so the resend
    hook never saw it) ran the command on to exit 0: the runner raises it again between cases."""
    from nearlocal.core.cases import Case
    from nearlocal.engine.children import interrupt_seen, raising_interrupt

    class Lost(KeyboardInterrupt):
        pass

    def swallowed(index: int) -> None:
        if index == 1:
            raising_interrupt(Lost)  # made by the handler, then cleared: never raised here

    interrupt_seen()
    runner, store = _runner(tmp_path, 3, events=_Events(new_pass=swallowed))
    with pytest.raises(Lost):
        _run(runner, [Case("i12c-flaky", "dram", "wb", "4KiB")])
    (row,) = load(store.finish()).cases.to_dict("records")
    assert row["status"] == "ok" and row["processes"] == 1  # the passes measured before it
    _run(_runner(tmp_path / "next", 1)[0], [Case("i12c-flaky", "dram", "wb", "4KiB")])  # raised once
