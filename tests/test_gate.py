"""Issue 19's first contact with the CI gate and acceptance: clock terms scaled by a row's
operations per sample, the equivalence verdict, compare's output off a terminal and in a GitHub
job summary, a spec aimed at a region with --region, run kinds and `latest:KIND`."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nearlocal.core.cases import Case
from nearlocal.core.rows import row_facts
from nearlocal.core.sampling import summarize
from nearlocal.frontends.cli import main
from nearlocal.gate.verdict import compare_runs
from nearlocal.store import Store, load
from nearlocal.store.schema import ops_per_sample, run_kind

INVENTORY = {"cpu": {"model": "Test CPU"}, "tsc_hz": 2.0e9,
             "numa": [{"node": 0, "cpus": [0, 1], "mem_total_bytes": 8 << 30}],
             "gpu": {"devices": []}}
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "acceptance"


def make_run(root: Path, levels: dict[str, float], seed: int, *, processes: int = 5,
             sigma: float = 0.01, n: int = 200, ops: int | None = None, kind: str = "run",
             step_ns: float = 10.0, overhead_ns: float = 20.0, info: dict | None = None,
             elapsed_s: float = 0.5) -> str:
    """A stored run: per case `processes` groups of n samples around its level (ns), each
    group's level drawn with `sigma` (the process-to-process spread), 1% noise within."""
    rng = np.random.default_rng(seed)
    store = Store.create(root, {"suite": "quick", "kind": kind, "host_id": "h",
                                "inventory": {**INVENTORY, "host_id": "h"}})
    for case_id, level in levels.items():
        method, region, attr, pattern = case_id.split("/")
        ns = np.concatenate([level * rng.lognormal(0, sigma) * rng.lognormal(0, 0.01, n)
                             for _ in range(processes)])
        row = row_facts(Case(method, region, attr, pattern))
        row.update(status="ok", reason="", converged=True, clock="tsc", processes=processes,
                   timer_overhead_ns=overhead_ns, clock_resolution_ns=step_ns,
                   elapsed_s=elapsed_s, info=info or {}, **summarize(ns, row["bytes_moved"]))
        if ops is not None:
            row["ops_per_sample"] = ops
        store.add_case(row, ns, ns, np.repeat(np.arange(processes), n))
    return store.finish().name


LEVELS = {f"{m}/dram/wb/{s}": 1e3 * 4**k for m in ("load", "store")
          for k, s in enumerate(("4KiB", "16KiB", "64KiB", "256KiB", "1MiB", "4MiB"))}


# ---------------------------------------------------------------- clock terms per operation


def test_a_chase_figure_carries_the_clock_terms_divided_by_its_hops(tmp_path):
    """The issue's regression: 277.6 -> 386.5 ns per load, 4,096 loads a sample, a 20 ns clock
    step. Per load the step is 0.005 ns, so the change is told; read as one operation per sample
    it was `within a few clock resolutions`."""
    chase = {"chase/dram/wb/1GiB": 277.6, **LEVELS}
    slowed = {**chase, "chase/dram/wb/1GiB": 386.5}
    base = load(make_run(tmp_path, chase, 1, ops=4096, step_ns=20.0), tmp_path)
    cand = load(make_run(tmp_path, slowed, 2, ops=4096, step_ns=20.0), tmp_path)
    verdict = {c.case_id: c for c in compare_runs(base, cand).cases}["chase/dram/wb/1GiB"]
    assert verdict.verdict == "slower" and "clock" not in verdict.note
    assert verdict.ratio == pytest.approx(386.5 / 277.6, rel=0.03)


def test_one_operation_per_sample_keeps_the_clock_terms_whole(tmp_path):
    """The same figures as whole samples (ops 1) are clock-bound: a 40 ns step on a ~300 ns
    median is within COARSE_STEPS steps, so the case stays ambiguous rather than guessed at,
    and says how many steps its figure spans."""
    chase = {"chase/dram/wb/1GiB": 277.6, **LEVELS}
    base = load(make_run(tmp_path, chase, 1, ops=1, step_ns=40.0), tmp_path)
    cand = load(make_run(tmp_path, {**chase, "chase/dram/wb/1GiB": 290.0}, 2, ops=1,
                         step_ns=40.0), tmp_path)
    verdict = {c.case_id: c for c in compare_runs(base, cand).cases}["chase/dram/wb/1GiB"]
    assert verdict.verdict == "ambiguous" and "clock steps of 40 ns" in verdict.note


def test_a_figure_of_many_clock_steps_is_not_held_back_for_the_clock(tmp_path):
    """Issue 36: a 20 ns step on a ~300 ns median (14 steps) is no clock limit: its note, if
    any, is not the clock's."""
    chase = {"chase/dram/wb/1GiB": 277.6, **LEVELS}
    base = load(make_run(tmp_path, chase, 1, ops=1, step_ns=20.0), tmp_path)
    cand = load(make_run(tmp_path, {**chase, "chase/dram/wb/1GiB": 290.0}, 2, ops=1,
                         step_ns=20.0), tmp_path)
    verdict = {c.case_id: c for c in compare_runs(base, cand).cases}["chase/dram/wb/1GiB"]
    assert "clock" not in verdict.note


def test_rows_stored_before_the_column_load_with_their_operations(tmp_path):
    path = tmp_path / make_run(tmp_path, {"chase/dram/wb/1GiB": 100.0}, 1,
                               info={"hops_per_sample": 4096})
    other = tmp_path / make_run(tmp_path, {"load/dram/wb/4KiB": 50.0}, 2)
    for run in (path, other):  # as an older version wrote them: no ops_per_sample column
        cases = pd.read_parquet(run / "cases.parquet").drop(columns="ops_per_sample")
        cases.to_parquet(run / "cases.parquet")
    assert load(path).cases["ops_per_sample"].tolist() == [4096]
    assert load(other).cases["ops_per_sample"].tolist() == [1]
    assert ops_per_sample(None, {"requests_per_sample": 64}) == 64
    assert ops_per_sample(float("nan"), {}) == 1


def test_sessions_state_their_operations_per_sample():
    from nearlocal.core.methods import load_methods
    from nearlocal.core.methods import ops_per_sample as session_ops
    from nearlocal.engine.worker import open_case
    from nearlocal.probe import probe

    load_methods()
    inventory = probe(gpu=False)
    with open_case(Case("chase", "dram", "wb", "16KiB"), inventory.tsc_hz, 40.0, False) as chase:
        assert session_ops(chase.session) == 4096
    with open_case(Case("load", "dram", "wb", "16MiB"), inventory.tsc_hz, 40.0, False) as plain:
        assert session_ops(plain.session) == 1  # one pass spans the clock's steps
    with open_case(Case("load", "dram", "wb", "64B"), inventory.tsc_hz, 40.0, False,
                   quantum_ticks=1e4) as short:
        assert session_ops(short.session) == short.session.passes > 1


# ---------------------------------------------------------------- equivalence


def test_unchanged_code_reads_same_within_a_stated_margin(tmp_path, capsys):
    base = make_run(tmp_path, LEVELS, 1, sigma=0.01)
    cand = make_run(tmp_path, LEVELS, 2, sigma=0.01)
    assert main(["compare", base, cand, "--out", str(tmp_path), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["counts"]["same"] == len(LEVELS)
    margin = report["equivalence"]["margin"]
    assert 0.05 <= margin <= 0.10
    assert f"same = within ±{margin:.1%}" in report["summary"]
    assert report["mode"] == "code" and report["head"].startswith("code CI, unpaired")


def test_noisy_runs_cap_the_margin_and_do_not_claim_same(tmp_path):
    base = load(make_run(tmp_path, LEVELS, 1, sigma=0.30), tmp_path)
    cand = load(make_run(tmp_path, LEVELS, 2, sigma=0.30), tmp_path)
    result = compare_runs(base, cand)
    assert result.margin == pytest.approx(0.10)
    assert result.counts()["same"] < len(LEVELS) // 2
    assert result.exit_code == 0


def test_a_real_change_beyond_the_margin_is_never_same(tmp_path):
    base = load(make_run(tmp_path, LEVELS, 1), tmp_path)
    cand = load(make_run(tmp_path, {k: v * 1.12 for k, v in LEVELS.items()}, 2), tmp_path)
    assert "same" not in {c.verdict for c in compare_runs(base, cand).cases}


def test_a_median_within_a_clock_step_or_two_is_not_shown_the_same(tmp_path):
    """40 ns on a 10 ns clock: each median may sit anywhere in its step (±12%)."""
    levels = {**LEVELS, "load/dram/wb/64B": 40.0}
    base = load(make_run(tmp_path, levels, 1), tmp_path)
    cand = load(make_run(tmp_path, levels, 2), tmp_path)
    small = {c.case_id: c for c in compare_runs(base, cand).cases}["load/dram/wb/64B"]
    assert small.verdict == "ambiguous"


# ---------------------------------------------------------------- output


def _slowed_pair(tmp_path: Path) -> tuple[str, str]:
    base = make_run(tmp_path, LEVELS, 1)
    cand = make_run(tmp_path, {**LEVELS, "store/dram/wb/4MiB": LEVELS["store/dram/wb/4MiB"] * 1.5,
                               "load/dram/wb/16KiB": LEVELS["load/dram/wb/16KiB"] / 1.5}, 2)
    return base, cand


def test_off_a_terminal_compare_prints_markdown_changed_cases_first(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    base, cand = _slowed_pair(tmp_path)
    assert main(["compare", base, cand, "--out", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert [r.split("|")[1].strip() for r in rows] == ["slower", "faster"]
    assert "`" not in rows[0] and "| store/dram/wb/4MiB " in rows[0]  # the id whole
    assert all(len(line) > 80 for line in rows)  # full width, never squeezed to 80 columns
    assert f"{len(LEVELS) - 2} more cases not listed: {len(LEVELS) - 2} same" in "\n".join(lines)
    assert not any("┃" in line or "…" in line for line in lines)


def test_github_job_summary_holds_the_regressions_and_improvements_only(tmp_path, capsys,
                                                                         monkeypatch):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    base, cand = _slowed_pair(tmp_path)
    assert main(["compare", base, cand, "--out", str(tmp_path), "--format", "junit",
                 "--output", str(tmp_path / "c.xml")]) == 1
    text = summary.read_text()
    assert text.startswith("earlier step\n")  # appended, as GitHub expects
    table = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [r.split("|")[1].strip() for r in table] == ["slower", "faster"]
    assert f"{len(LEVELS) - 2} more cases not listed: {len(LEVELS) - 2} same" in text
    assert ET.parse(tmp_path / "c.xml").getroot().find("testsuite").get("failures") == "1"


# ---------------------------------------------------------------- accept


@pytest.fixture
def accept_run(tmp_path) -> str:
    levels = {"load/dram/wb/16KiB": 100.0, "load/numa:0/wb/16KiB": 110.0,
              "load/dram:thp/wb/16KiB": 95.0}
    return make_run(tmp_path, levels, 1, processes=1, elapsed_s=1.25)


POOL_SPEC = """
pool = "numa:5"
[defaults]
region = "{pool}"
[[requirement]]
name = "pool load near local"
case = { method = "load", size = "16KiB" }
max_ratio_to = { region = "dram", ratio = 1.25 }
[[requirement]]
name = "pool load under 1 us"
case = { method = "load", size = "16KiB" }
max = "1us"
"""


def test_a_spec_names_its_pool_once_and_region_aims_it(tmp_path, accept_run, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(POOL_SPEC)
    junit = tmp_path / "j.xml"
    assert main(["accept", str(spec), accept_run, "--out", str(tmp_path), "--region", "numa:0",
                 "--junit", str(junit)]) == 0
    assert "2 passed, 0 failed" in capsys.readouterr().out
    times = [case.get("time") for case in ET.parse(junit).getroot().iter("testcase")]
    assert times == ["2.500", "1.250"]  # the case and its reference / the case alone


def test_a_pool_this_box_lacks_is_exit_2_naming_what_probe_lists(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(POOL_SPEC)
    assert main(["accept", str(spec), "--out", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "the pool numa:5 is not on this box" in err and "probe lists dram" in err
    assert not (tmp_path / "store").exists() or not list((tmp_path / "store").iterdir())
    assert main(["accept", str(EXAMPLES / "beluga-cxl.toml"), "--out", str(tmp_path / "s"),
                 "--region", "numa:9"]) == 2
    assert "the pool numa:9" in capsys.readouterr().err


def test_a_spec_without_pool_has_its_default_region_as_pool(tmp_path, accept_run, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(POOL_SPEC.replace('pool = "numa:5"\n', "").replace('"{pool}"', '"dram"'))
    assert main(["accept", str(spec), accept_run, "--out", str(tmp_path),
                 "--region", "dram:thp"]) == 0
    out = capsys.readouterr().out
    assert "2 passed" in out


def test_not_measured_reasons_print_one_line_each(tmp_path, accept_run, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(POOL_SPEC)
    assert main(["accept", str(spec), accept_run, "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    reason = "not measured: load/numa:5/wb/16KiB is not in the run"
    lines = [line for line in out.splitlines() if reason in line]
    assert lines == [f"  {reason} (requirements 1, 2)"]


def test_beluga_example_names_its_pool_once():
    from nearlocal.acceptance.spec import parse_spec

    spec = parse_spec(EXAMPLES / "beluga-cxl.toml", region="devdax:/dev/dax0.0")
    assert spec.pool == "devdax:/dev/dax0.0"
    regions = {c.region for c in spec.cases()}
    assert "numa:1" not in " ".join(regions)
    assert "registered:devdax:/dev/dax0.0" in regions and "devdax:/dev/dax0.0" in regions
    assert (EXAMPLES / "beluga-cxl.toml").read_text().count("numa:1") == 2  # the pool + usage


# ---------------------------------------------------------------- run kinds


def test_latest_is_the_latest_run_and_latest_kind_picks_another(tmp_path, capsys):
    plain = make_run(tmp_path, LEVELS, 1)
    accepted = make_run(tmp_path, LEVELS, 2, kind="accept")
    legacy = tmp_path / make_run(tmp_path, LEVELS, 3, kind="accept")
    meta = json.loads((legacy / "run.json").read_text())
    del meta["kind"]  # stored before kinds: told by its suite
    (legacy / "run.json").write_text(json.dumps({**meta, "suite": "accept:x.toml"}))
    assert load("latest", tmp_path).run_id == plain
    assert load(None, tmp_path).run_id == plain
    assert load("latest:accept", tmp_path).run_id == legacy.name
    assert main(["compare", "latest", "latest", "--out", str(tmp_path), "--format", "json"]) == 0
    capsys.readouterr()
    assert main(["runs", "--out", str(tmp_path)]) == 0
    listing = capsys.readouterr().out
    assert "| kind " in listing
    assert sum(" accept " in line for line in listing.splitlines()) == 2
    assert main(["show", "latest:bench", "--out", str(tmp_path)]) == 2
    assert "no runs of kind bench" in capsys.readouterr().err
    assert main(["show", "latest:nonsense", "--out", str(tmp_path)]) == 2
    assert accepted


def test_run_kind_of_older_runs():
    assert run_kind({"suite": "quick"}) == "run"
    assert run_kind({"suite": "accept:beluga-cxl.toml"}) == "accept"
    assert run_kind({"suite": "quick", "source": "pytest-benchmark"}) == "import"
    assert run_kind({"kind": "bench"}) == "bench"


def test_an_imported_run_keeps_its_suite_and_the_start_time_format():
    from nearlocal.frontends.importer import _started

    assert _started("2026-12-01T12:31:08.123456+00:00") == "2026-12-01T12:31:08+0000"
    assert _started("2026-12-01T12:31:08.123456") == "2026-12-01T12:31:08+0000"
