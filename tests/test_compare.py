"""`nearlocal compare` and `nearlocal baseline` on synthetic runs written through the store API."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from nearlocal.core.cases import Case
from nearlocal.core.rows import row_facts
from nearlocal.core.sampling import summarize
from nearlocal.frontends.cli import main
from nearlocal.gate.estimate import bootstrap_medians
from nearlocal.gate.identity import host_differences
from nearlocal.gate.verdict import compare_runs
from nearlocal.store import Store, load

SIZES = ("4KiB", "16KiB", "64KiB", "256KiB", "1MiB", "4MiB", "16MiB", "64MiB", "256MiB", "1GiB")
INVENTORY = {"cpu": {"model": "Test CPU"}, "tsc_hz": 2.0e9,
             "numa": [{"node": 0, "cpus": [0, 1], "mem_total_bytes": 8 << 30}],
             "gpu": {"devices": []}}


def _samples(seed: int, n: int = 400) -> dict[str, np.ndarray]:
    """Per case: n samples around 10 us x 2^k with 2% lognormal noise."""
    rng = np.random.default_rng(seed)
    return {f"load/dram/wb/{size}": 1e4 * 2**k * rng.lognormal(0, 0.02, n)
            for k, size in enumerate(SIZES)}


def make_run(root: Path, samples: dict[str, np.ndarray], host_id: str = "host-a",
             inventory: dict | None = None, converged: bool = True, skipped: dict | None = None,
             overhead_ns: float = 20.0) -> str:
    store = Store.create(root, {"suite": "test", "host_id": host_id,
                                "inventory": {**(inventory or INVENTORY), "host_id": host_id}})
    for case_id, ns in samples.items():
        method, region, attr, pattern = case_id.split("/")
        row = row_facts(Case(method, region, attr, pattern))
        row.update(status="ok", reason="", converged=converged, clock="tsc",
                   timer_overhead_ns=overhead_ns, **summarize(ns, row["bytes_moved"]))
        store.add_case(row, ns * 2.0, ns)
    for case_id, reason in (skipped or {}).items():
        method, region, attr, pattern = case_id.split("/")
        store.add_case({**row_facts(Case(method, region, attr, pattern)), "status": "skipped",
                        "reason": reason})
    return store.finish().name


def test_identical_samples_are_no_regression(tmp_path, capsys):
    base = make_run(tmp_path, _samples(1))
    cand = make_run(tmp_path, _samples(1))
    assert main(["compare", base, cand, "--out", str(tmp_path), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["regression"] is False
    assert report["counts"]["same"] == len(SIZES)
    assert all(c["ratio"] == pytest.approx(1.0) for c in report["cases"])


def test_samples_scaled_by_1_3_are_a_regression_in_every_case(tmp_path, capsys):
    samples = _samples(2)
    base = make_run(tmp_path, samples)
    cand = make_run(tmp_path, {k: v * 1.3 for k, v in samples.items()})
    assert main(["compare", base, cand, "--out", str(tmp_path), "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["counts"]["slower"] == len(SIZES)
    assert all(c["ci_low"] > 1.05 and c["p_value"] < 0.01 for c in report["cases"])


def test_one_slower_case_among_independent_noise(tmp_path):
    base, cand = _samples(3), _samples(4)
    cand["load/dram/wb/1MiB"] = cand["load/dram/wb/1MiB"] * 1.5
    result = compare_runs(load(make_run(tmp_path, base), tmp_path),
                          load(make_run(tmp_path, cand), tmp_path))
    verdicts = {c.case_id: c.verdict for c in result.cases}
    assert verdicts.pop("load/dram/wb/1MiB") == "slower"
    assert set(verdicts.values()) == {"same"}
    assert result.exit_code == 1


def test_faster_is_not_a_failure(tmp_path):
    samples = _samples(5)
    base = make_run(tmp_path, samples)
    cand = make_run(tmp_path, {k: v / 1.3 for k, v in samples.items()})
    assert main(["compare", base, cand, "--out", str(tmp_path), "--format", "json",
                 "--output", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["counts"]["faster"] == len(SIZES)


def test_unconverged_case_is_at_most_ambiguous(tmp_path):
    samples = _samples(6)
    base = make_run(tmp_path, samples, converged=False)
    cand = make_run(tmp_path, {k: v * 1.3 for k, v in samples.items()})
    result = compare_runs(load(base, tmp_path), load(cand, tmp_path))
    assert {c.verdict for c in result.cases} == {"ambiguous"}
    assert "not converged in the base" in result.cases[0].note
    assert result.exit_code == 0


def test_a_different_timer_overhead_estimate_is_not_a_change(tmp_path):
    """A 40 ns case: the second run's overhead estimate is one 10 ns clock step lower."""
    rng = np.random.default_rng(7)
    raw = {f"load/dram/wb/{s}": 60.0 + 10.0 * rng.integers(0, 2, 500) for s in ("64B", "256B")}
    base = make_run(tmp_path, {k: v - 30.0 for k, v in raw.items()}, overhead_ns=30.0)
    cand = make_run(tmp_path, {k: v - 20.0 for k, v in raw.items()}, overhead_ns=20.0)
    result = compare_runs(load(base, tmp_path), load(cand, tmp_path))
    assert all(c.ratio == pytest.approx(1.0) for c in result.cases)
    assert result.exit_code == 0


def test_missing_and_new_cases_are_listed(tmp_path):
    samples = _samples(8)
    base = make_run(tmp_path, dict(list(samples.items())[:-1]))
    cand = make_run(tmp_path, dict(list(samples.items())[1:]),
                    skipped={"load/dram/wb/4KiB": "CPU lacks avx2"})
    result = compare_runs(load(base, tmp_path), load(cand, tmp_path))
    by_verdict = {c.verdict: c for c in result.cases if c.verdict in ("missing", "new")}
    assert by_verdict["missing"].case_id == "load/dram/wb/4KiB"
    assert "skipped in the candidate: CPU lacks avx2" in by_verdict["missing"].note
    assert by_verdict["new"].case_id == "load/dram/wb/1GiB"
    assert result.exit_code == 0


def test_runs_from_different_hosts_are_refused(tmp_path, capsys):
    other = {**INVENTORY, "cpu": {"model": "Other CPU"}}
    base = make_run(tmp_path, _samples(9))
    cand = make_run(tmp_path, _samples(9), host_id="host-b", inventory=other)
    assert main(["compare", base, cand, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "different hardware" in err and "CPU Test CPU vs Other CPU" in err
    assert "--cross-host" in err
    assert main(["compare", base, cand, "--out", str(tmp_path), "--cross-host",
                 "--format", "markdown"]) == 0
    assert "cross-host comparison" in capsys.readouterr().out


def test_same_hardware_with_drifting_memory_size_is_the_same_host():
    a = {"host_id": "x", "inventory": INVENTORY}
    drifted = {**INVENTORY, "numa": [{"node": 0, "cpus": [0, 1], "mem_total_bytes": 7 << 30}],
               "tsc_hz": 2.0001e9}
    assert host_differences(a, {"host_id": "y", "inventory": drifted}) == []
    more_nodes = {**INVENTORY, "numa": [*INVENTORY["numa"], {"node": 1, "cpus": [],
                                                              "mem_total_bytes": 8 << 30}]}
    assert host_differences(a, {"host_id": "z", "inventory": more_nodes})


def test_junit_has_one_testcase_per_case_and_fails_slower_ones(tmp_path):
    samples = _samples(10)
    base = make_run(tmp_path, samples)
    cand = make_run(tmp_path, {k: v * (1.3 if "MiB" in k else 1.0) for k, v in samples.items()})
    out = tmp_path / "compare.xml"
    assert main(["compare", base, cand, "--out", str(tmp_path), "--format", "junit",
                 "--output", str(out)]) == 1
    suite = ET.parse(out).getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == len(SIZES)
    failed = {c.get("name") for c in cases if c.find("failure") is not None}
    assert failed == {k for k in samples if "MiB" in k}
    assert suite.get("failures") == str(len(failed))


def test_baseline_per_host(tmp_path, capsys):
    samples = _samples(11)
    base = make_run(tmp_path, samples)
    assert main(["compare", "baseline", "latest", "--out", str(tmp_path)]) == 2
    assert "no baseline for host host-a" in capsys.readouterr().err
    assert main(["baseline", "set", base, "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "baselines" / "host-a.json").read_text())
    assert record["run"] == base
    cand = make_run(tmp_path, {k: v * 1.3 for k, v in samples.items()})
    assert main(["compare", "baseline", cand, "--out", str(tmp_path), "--format", "markdown"]) == 1
    out = capsys.readouterr().out
    assert f"`{base}` → `{cand}`" in out and "**regression**" in out
    assert main(["baseline", "show", "--out", str(tmp_path)]) == 0
    assert base in capsys.readouterr().out


def test_bad_threshold_is_a_usage_error(tmp_path, capsys):
    run = make_run(tmp_path, _samples(12))
    assert main(["compare", run, run, "--out", str(tmp_path), "--threshold", "five"]) == 2
    assert "threshold" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_unwritable_output_is_a_usage_error(tmp_path, capsys, fmt):
    run = make_run(tmp_path, _samples(12))
    args = ["compare", run, run, "--out", str(tmp_path), "--format", fmt]
    assert main([*args, "--output", str(tmp_path / "no-such-dir" / "out.txt")]) == 2
    assert main([*args, "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("cannot write") == 2 and "Traceback" not in err


@pytest.mark.parametrize("n", [51, 50])
def test_bootstrap_medians_match_a_resampling_bootstrap(n):
    rng = np.random.default_rng(n)
    x = rng.lognormal(0, 0.3, n)
    exact = bootstrap_medians(x, rng.random(40_000))
    brute = np.median(x[rng.integers(0, n, (20_000, n))], axis=1)
    for q in (5, 25, 50, 75, 95):
        assert np.percentile(exact, q) == pytest.approx(np.percentile(brute, q), rel=0.02)


def test_past_baselines_spread_widens_a_case_that_jumps_between_runs(tmp_path, capsys):
    """A case that alternated between 10 and 20 us in past baselines is not a regression when it
    reads 20 us again; without history (--history 0) it is."""
    rng = np.random.default_rng(13)

    def run(jumpy_level: float) -> str:
        samples = _samples(int(rng.integers(1 << 30)))
        samples["load/dram/wb/4KiB"] = jumpy_level * rng.lognormal(0, 0.02, 400)
        return make_run(tmp_path, samples)

    for level in (1e4, 2e4, 1e4, 2e4, 1e4):
        assert main(["baseline", "set", run(level), "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "baselines" / "host-a.json").read_text())
    assert len(record["history"]) == 4
    cand = run(2e4)
    capsys.readouterr()
    assert main(["compare", "baseline", cand, "--out", str(tmp_path), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["history_runs"] == 5
    jumpy = next(c for c in report["cases"] if c["case_id"] == "load/dram/wb/4KiB")
    assert jumpy["verdict"] == "ambiguous" and jumpy["ratio"] == pytest.approx(2.0, rel=0.05)
    assert main(["compare", "baseline", cand, "--out", str(tmp_path), "--history", "0"]) == 1


def test_a_past_baseline_that_cannot_be_read_is_said_with_its_error(tmp_path, capsys):
    """A damaged history run narrows the noise floor: the comparison names it and why, in
    every format, and judges on the runs that remain."""
    runs = [make_run(tmp_path, _samples(seed)) for seed in range(4)]
    for run in runs:
        assert main(["baseline", "set", run, "--out", str(tmp_path)]) == 0
    (tmp_path / runs[1] / "cases.parquet").write_bytes(b"")  # a disk that filled, say
    cand = make_run(tmp_path, _samples(9))
    capsys.readouterr()
    assert main(["compare", "baseline", cand, "--out", str(tmp_path), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["history_runs"] == 3
    assert (f"history: 1 past baseline run could not be read and left out of the noise "
            f"estimate (a narrower floor): {runs[1]} (run ") in report["host_note"]
    assert "cases.parquet is empty (0 bytes)" in report["host_note"]
    assert main(["compare", "baseline", cand, "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert f"{runs[1]} (run " in table and "cases.parquet is empty" in table
    assert main(["compare", "baseline", cand, "--out", str(tmp_path), "--format", "junit"]) == 0
    properties = {p.get("name"): p.get("value")
                  for p in ET.fromstring(capsys.readouterr().out).iter("property")}
    assert runs[1] in properties["note"] and "cases.parquet is empty" in properties["note"]


def test_runs_without_samples_and_a_zero_median_give_no_ratio(tmp_path):
    store = Store.create(tmp_path, {"suite": "test", "host_id": "h"})
    row = row_facts(Case("load", "dram", "wb", "64"))
    row.update(status="ok", reason="", median_ns=0.0, n_samples=10)
    store.add_case(row)  # summary only, as imported from a file saved without rounds
    run = load(store.finish())
    (case,) = compare_runs(run, run).cases
    assert case.verdict == "ambiguous" and "no raw samples" in case.note
    assert case.to_dict()["ratio"] is None
