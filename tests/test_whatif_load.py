"""Serving under load (issue 57 item 2, docs/whatif.md): the simulation core against queueing
theory's closed forms (M/D/1, M/M/1, M/M/1-PS), the shared Mooncake trace's figures through an
unbounded prefix store, the LRU store, determinism under a seed, the capacity search, the
command's outputs, and its bad input (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nearlocal.errors import UsageError
from nearlocal.frontends.cli import main
from nearlocal.store import load
from nearlocal.whatif import inputs_of, traffic
from nearlocal.whatif.load import (
    Setup,
    fifo,
    fifo_servers,
    link_contention,
    processor_sharing,
    serve,
    simulate,
    stream_workload,
    trace_workload,
)
from nearlocal.whatif.traffic import SHIPPED_TRACE, Contexts, poisson, prefix_hits, read_trace

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "tests" / "fixtures" / "runs" / "h200-gpu-suite"
TRACE = SHIPPED_TRACE
needs_trace = pytest.mark.skipif(not TRACE.exists(), reason=f"the shipped trace {TRACE} is absent")


# --------------------------------------------------------------------------- the core


def _poisson(rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
    return np.cumsum(rng.exponential(1 / rate, n))


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_constant_service_waits_as_md1(rho):
    """M/D/1: mean wait rho s / (2 (1 - rho)), within 3 % over 2M seeded arrivals."""
    n, s = 2_000_000, 1.0
    arrival = _poisson(np.random.default_rng(7), rho / s, n)
    timeline = simulate(arrival, np.full(n, s))
    assert timeline.wait.mean() == pytest.approx(rho * s / (2 * (1 - rho)), rel=0.03)
    assert np.all(timeline.transfer == s)


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_exponential_service_p99_as_mm1(rho):
    """M/M/1: the time in system is exponential at mu - lambda: P99 = ln(100) / (mu - lambda)."""
    n, mu = 2_000_000, 1.0
    rng = np.random.default_rng(11)
    arrival = _poisson(rng, rho * mu, n)
    timeline = simulate(arrival, rng.exponential(1 / mu, n))
    sojourn = timeline.wait + timeline.transfer
    assert np.percentile(sojourn, 99) == pytest.approx(math.log(100) / (mu - rho * mu), rel=0.03)


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_a_fairly_shared_link_is_mm1_ps(rho):
    """Processor sharing at the one-mover rate: mean time in system 1 / (mu - lambda), as
    FIFO's (M/M/1-PS); the link busy as long as FIFO's."""
    n, mu = 1_000_000, 1.0  # at rho 0.8 waits are long-correlated: 300k samples vary by 4 %
    rng = np.random.default_rng(3)
    arrival = _poisson(rng, rho * mu, n)
    work = rng.exponential(1 / mu, n)
    end, busy = processor_sharing(arrival, work, np.ones(1))
    assert (end - arrival).mean() == pytest.approx(1 / (mu - rho * mu), rel=0.03)
    assert busy == pytest.approx(work.sum(), rel=1e-9)
    assert np.all(end - arrival >= work - 1e-9)


def test_a_link_with_more_aggregate_at_k_serves_faster():
    """The per-k hook: a link whose aggregate doubles with two movers in flight."""
    arrival, work = np.array([0.0, 0.0]), np.array([1.0, 1.0])
    one, _ = processor_sharing(arrival, work, np.ones(1))
    two, _ = processor_sharing(arrival, work, np.array([1.0, 2.0]))
    assert one.tolist() == pytest.approx([2.0, 2.0]) and two.tolist() == pytest.approx([1.0, 1.0])


def test_links_gpus_and_prefill_queue_as_said():
    """Two links, one GPU each: requests alternate; the prefill waits for the reload."""
    arrival = np.array([0.0, 0.0, 0.0, 0.0])
    timeline = simulate(arrival, np.ones(4), np.full(4, 0.5), links=2, gpus_per_link=1)
    assert timeline.wait.tolist() == [0.0, 0.0, 1.0, 1.0]
    assert timeline.prefill_wait.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert timeline.ttft.tolist() == [1.5, 1.5, 2.5, 2.5]
    assert timeline.busy.tolist() == [2.0, 2.0]
    shared = simulate(arrival, np.zeros(4), np.ones(4), links=1, gpus_per_link=2)
    assert shared.prefill_wait.tolist() == [0.0, 0.0, 1.0, 1.0] and shared.busy.tolist() == [0]


# --------------------------------------------------------------------------- traces and store


def _write(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in records))
    return path


def _req(ms: float, tokens: int, hashes: list[int]) -> dict:
    return {"timestamp": ms, "input_length": tokens, "output_length": 1, "hash_ids": hashes}


@needs_trace
def test_the_shared_conversation_trace_through_an_unbounded_store():
    trace = read_trace(TRACE)
    hits = prefix_hits(trace)
    assert len(trace) == 12031 and round(trace.duration_s) == 3537
    assert round(trace.rate, 2) == 3.40 and round(float(trace.input_tokens.mean())) == 12035
    assert (hits.hit_blocks, hits.total_blocks) == (105710, 288500)
    assert round(100 * hits.ratio, 1) == 36.6


def test_the_store_hits_a_prefix_and_evicts_the_least_recently_used(tmp_path):
    trace = read_trace(_write(tmp_path / "t.jsonl", [
        _req(0, 1024, [1, 2]), _req(1, 1536, [1, 2, 3]), _req(2, 1024, [9, 2]),
        _req(3, 600, [4, 5]), _req(4, 1024, [1, 2])]))
    unbounded = prefix_hits(trace)
    # a prefix: [9, 2] misses at 9, so block 2 does not count though it is stored
    assert unbounded.blocks.tolist() == [0, 2, 0, 0, 2]
    assert unbounded.tokens.tolist() == [0, 1024, 0, 0, 1024]
    small = prefix_hits(trace, capacity_blocks=3)
    # after request 3 the store holds 2, 4, 5 (1 and 3, 9 evicted): the last misses
    assert small.blocks.tolist() == [0, 2, 0, 0, 0]
    assert small.hit_blocks == 2 and small.total_blocks == 11
    with pytest.raises(UsageError, match="at least one block"):
        prefix_hits(trace, capacity_blocks=0)


def test_a_partial_last_block_hits_only_its_tokens(tmp_path):
    trace = read_trace(_write(tmp_path / "t.jsonl", [_req(0, 600, [1, 2]), _req(5, 600, [1, 2])]))
    assert prefix_hits(trace).tokens.tolist() == [0, 600]
    assert trace.arrival_s.tolist() == [0.0, 0.005]


def test_a_poisson_stream_is_seeded_and_draws_its_contexts():
    a = poisson(4.0, 1000, Contexts("uniform", 0, 1024, 4096), seed=5)
    b = poisson(4.0, 1000, Contexts("uniform", 0, 1024, 4096), seed=5)
    assert np.array_equal(a.unit_arrivals, b.unit_arrivals)
    assert np.array_equal(a.input_tokens, b.input_tokens)
    assert a.input_tokens.min() >= 1024 and a.input_tokens.max() <= 4096
    work = stream_workload(a, cached=0.5)
    assert work.qps == 4.0 and work.hit_tokens.tolist() == np.rint(a.input_tokens * 0.5).tolist()
    assert len(a) / (a.unit_arrivals[-1] / 4.0) == pytest.approx(4.0, rel=0.1)


# --------------------------------------------------------------------------- over the box's rows


def test_serving_under_load_is_deterministic_and_names_its_rows():
    run = load(H200)
    stream = poisson(2.0, 2000, Contexts("fixed", 16384), seed=1)
    setup = Setup(prefill_tokens_per_s=20000.0, ttft_target_s=2.0, seed=1)
    first = serve(inputs_of(run), stream_workload(stream, 0.5), setup, samples=run.samples)
    again = serve(inputs_of(run), stream_workload(stream, 0.5), setup, samples=run.samples)
    assert first.as_dict() == again.as_dict()
    offload = next(p for p in first.paths if p.path == "cpu-offload")
    assert offload.complete and offload.rows and all("cuda-memcpy" in r for r in offload.rows)
    assert offload.ttft.p50 <= offload.ttft.p90 <= offload.ttft.p99
    assert offload.prefill.p50 == pytest.approx(8192 / 20000.0)
    assert 0 < offload.link_utilisation < 1 and offload.capacity_qps > 0
    alone = serve(inputs_of(run), stream_workload(stream, 0.5),
                  Setup(prefill_tokens_per_s=20000.0, ttft_target_s=2.0, seed=1,
                        paths=("cpu-offload",)), samples=run.samples)
    assert alone.paths[0] == offload  # a path's draws do not depend on the paths beside it
    missing = next(p for p in first.paths if p.path == "nvlink")
    assert not missing.complete and "not measured" in missing.missing
    assert any("one mover" in a for a in first.assumptions)
    assert any("no movers=k rows" in n and "1 at every k" in n for n in offload.notes)


def test_the_capacity_keeps_p99_under_the_target():
    """At the capacity found P99 TTFT is under the target; a little past it, over."""
    run = load(H200)
    stream = poisson(1.0, 3000, Contexts("fixed", 16384), seed=2)
    setup = Setup(ttft_target_s=0.5, paths=("cpu-offload",))
    result = serve(inputs_of(run), stream_workload(stream, 1.0), setup)
    capacity = result.paths[0].capacity_qps
    at = serve(inputs_of(run), stream_workload(poisson(capacity, 3000, Contexts("fixed", 16384),
                                                       seed=2), 1.0), setup)
    past = serve(inputs_of(run), stream_workload(poisson(capacity * 1.01, 3000,
                                                         Contexts("fixed", 16384), seed=2), 1.0),
                 setup)
    assert at.paths[0].ttft.p99 <= 0.5 < past.paths[0].ttft.p99


def test_without_a_prefill_rate_ttft_is_the_reload_and_says_so():
    run = load(H200)
    result = serve(inputs_of(run), stream_workload(poisson(1.0, 500, Contexts(), 0), 1.0),
                   Setup(paths=("cpu-offload",)))
    path = result.paths[0]
    assert path.prefill is None and path.capacity_qps is None
    assert path.transfer.p99 <= path.ttft.p99 <= path.reload_wait.p99 + path.transfer.p99 + 1e-9
    assert any("TTFT here is the reload alone" in a for a in result.assumptions)


@needs_trace
def test_the_trace_time_scaled_to_a_qps():
    trace = read_trace(TRACE)
    work = trace_workload(trace, qps=6.8)
    assert work.qps == pytest.approx(6.8) and work.load == pytest.approx(2.0, rel=1e-3)


# --------------------------------------------------------------------------- the command


def _store(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    shutil.copytree(H200, root / H200.name)
    return root


def test_the_command_json_and_markdown_on_a_small_trace(tmp_path, capsys):
    root = _store(tmp_path)
    trace = _write(tmp_path / "t.jsonl", [_req(i * 250, 4096, [0, 1, 2, 3, 4, 5, 6, 7])
                                          for i in range(40)])
    args = ["whatif", "--out", str(root), "--trace", str(trace), "--prefill-tokens-per-s",
            "20000", "--ttft-target", "2s", "--path", "cpu-offload"]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["requests"] == 40 and data["hit_blocks"] == 39 * 8
    (path,) = data["paths"]
    assert path["path"] == "cpu-offload" and path["rows"] and path["capacity_qps"] > 0
    target = tmp_path / "load.md"
    assert main([*args, "--markdown", str(target)]) == 0
    text = target.read_text()
    assert "## Serving under load" in text and "| cpu-offload |" in text and "rows " in text
    assert main(args) == 0
    assert "cpu-offload" in capsys.readouterr().out


def test_the_command_on_a_poisson_stream(tmp_path, capsys):
    root = _store(tmp_path)
    assert main(["whatif", "--out", str(root), "--qps", "2", "--requests", "500", "--json",
                 "--contexts", "uniform:4k:16k", "--link-sharing", "ps"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["qps"] == 2 and data["requests"] == 500 and len(data["paths"]) == 5


BAD = [
    (['{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}', "{oops"],
     [], "t.jsonl:2: malformed JSON"),
    ([{"timestamp": 0, "input_length": 5, "hash_ids": [1]}], [], "missing field 'output_length'"),
    ([_req(5, 5, [1]), _req(4, 5, [1])], [], "t.jsonl:2: timestamp 4 goes back"),
    ([_req(0, -5, [1])], [], "input_length must not be negative"),
    ([_req(0, 5, [1])], ["--path", "carrier-pigeon"], "--path 'carrier-pigeon'"),
    ([_req(0, 5, [1])], ["--qps", "0"], "--qps must be a positive number"),
    ([_req(0, 5, [1])], ["--qps", "-3"], "--qps must be a positive number"),
    ([_req(0, 5, [1])], ["--store-capacity", "0"], "--store-capacity"),
    ([_req(0, 5, [1])], ["--store-capacity", "1KiB"], "less than one 512-token block"),
    ([_req(0, 5, [1])], ["--links", "0"], "--links must be at least 1"),
    ([_req(0, 5, [1])], ["--ttft-target", "soon"], "--ttft-target"),
    ([_req(0, 5, [1])], ["--link-sharing", "lottery"], "--link-sharing 'lottery'"),
]


@pytest.mark.parametrize(("records", "extra", "message"), BAD)
def test_bad_load_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, records, extra,
                                                              message):
    root = _store(tmp_path)
    trace = _write(tmp_path / "t.jsonl", records)
    target = tmp_path / "w.md"
    code = main(["whatif", "--out", str(root), "--markdown", str(target), "--trace", str(trace),
                 *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not target.exists()


def test_a_trace_past_the_limit_is_refused_before_it_is_read(tmp_path, capsys, monkeypatch):
    root = _store(tmp_path)
    trace = _write(tmp_path / "t.jsonl", [_req(i, 5, [1]) for i in range(100)])
    monkeypatch.setattr(traffic, "MAX_TRACE_BYTES", 1024)
    target = tmp_path / "w.md"
    assert main(["whatif", "--out", str(root), "--markdown", str(target), "--trace",
                 str(trace)]) == 2
    err = capsys.readouterr().err.strip()
    assert "past the" in err and len(err.splitlines()) == 1 and not target.exists()


def test_a_stream_with_a_store_capacity_is_bad_input(tmp_path, capsys):
    root = _store(tmp_path)
    assert main(["whatif", "--out", str(root), "--qps", "1", "--store-capacity", "1TiB"]) == 2
    assert "--store-capacity needs --trace" in capsys.readouterr().err


# --------------------------------------------------------------------------- acceptance

LOAD_SPEC = """
title = "serving under load"
[[requirement]]
name = "P99 TTFT <= 2 s at 4 QPS over CPU offload"
whatif = {{ path = "cpu-offload", cached = 0.5, qps = 4, requests = 2000, prefill_tokens_per_s = 80000 }}
metric = "ttft_p99_ns"
max = "2s"
[[requirement]]
name = "capacity >= 5 QPS at P99 TTFT <= 2 s"
whatif = {{ path = "cpu-offload", qps = 4, requests = 2000, ttft_target = "2s" }}
metric = "capacity_qps"
min = {capacity}
[[requirement]]
name = "P99 TTFT <= 2 s at 4 QPS over the pool"
whatif = {{ path = "cxl-pool", qps = 4, requests = 2000 }}
metric = "ttft_p99_ns"
max = "2s"
"""


def test_acceptance_on_figures_under_load(tmp_path, capsys):
    root = _store(tmp_path)
    spec = tmp_path / "load.toml"
    spec.write_text(LOAD_SPEC.format(capacity=5))
    out = tmp_path / "v.json"
    assert main(["accept", str(spec), H200.name, "--out", str(root), "--json", str(out)]) == 1
    offload, capacity, pool = json.loads(out.read_text())["verdicts"]
    assert offload["passed"] and offload["measured"] <= 2e9 and offload["derived_from"]
    assert "qps=4" in offload["case"]
    assert capacity["passed"] and capacity["measured"] > 5
    assert not pool["passed"] and "not measured" in pool["reason"]
    spec.write_text(LOAD_SPEC.format(capacity=1000))
    assert main(["accept", str(spec), H200.name, "--out", str(root), "--json", str(out)]) == 1
    verdicts = json.loads(out.read_text())["verdicts"]
    assert not verdicts[1]["passed"] and verdicts[1]["measured"] < 1000


@pytest.mark.parametrize(("whatif", "metric", "message"), [
    ('{ path = "cpu-offload" }', "ttft_p99_ns", "needs whatif's qps"),
    ('{ path = "cpu-offload", qps = 0 }', "ttft_p99_ns", "qps must be a positive number"),
    ('{ path = "cpu-offload", qps = 4 }', "reload_ns", "go with a load metric"),
    ('{ path = "cpu-offload", qps = 4 }', "capacity_qps", "needs whatif's ttft_target"),
    ('{ path = "cpu-offload", qps = 4, link_sharing = "x" }', "ttft_p99_ns", "--link-sharing"),
])
def test_a_malformed_load_requirement_is_bad_input(tmp_path, capsys, whatif, metric, message):
    spec = tmp_path / "bad.toml"
    spec.write_text(f'[[requirement]]\nwhatif = {whatif}\nmetric = "{metric}"\nmax = "2s"\n')
    assert main(["accept", str(spec), str(H200)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# G movers per link, and a link's contention from movers=k rows


def test_one_mover_on_a_queue_is_lindleys_fifo():
    rng = np.random.default_rng(3)
    arrival = np.cumsum(rng.exponential(1.0, 500))
    work = rng.exponential(0.8, 500)
    start, end = fifo_servers(arrival, work, 1)
    expected_start, expected_end = fifo(arrival, work)
    assert np.allclose(start, expected_start) and np.allclose(end, expected_end)


def test_movers_share_a_queue_at_the_rate_measured_with_k_in_service():
    arrival, work = np.zeros(3), np.ones(3)
    start, end = fifo_servers(arrival, work, 2)
    assert start.tolist() == [0.0, 0.0, 1.0] and end.tolist() == [1.0, 1.0, 2.0]
    start, end = fifo_servers(arrival, work, 2, rate=lambda k: 1.0 if k == 1 else 0.5)
    # two in service at half speed each end at 2; the third then runs alone
    assert start.tolist() == [0.0, 0.0, 2.0] and end.tolist() == [2.0, 2.0, 3.0]
    start, end = fifo_servers(arrival, work, 2, draw=lambda k: float(k))
    assert end.tolist() == [1.0, 2.0, 3.0]  # the 2nd and 3rd started with k = 2: 2x work


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_two_movers_match_erlang_c(rho):
    """M/M/2's mean wait: P(wait) / (2 mu - lambda), P(wait) = 2 rho^2 / (1 + rho)."""
    n, mu = 1_000_000, 1.0  # at rho 0.8 waits are long-correlated: 300k samples vary by 4 %
    lam = 2 * rho * mu
    rng = np.random.default_rng(7)
    arrival = np.cumsum(rng.exponential(1 / lam, n))
    start, _ = fifo_servers(arrival, rng.exponential(1 / mu, n), 2)
    expected = 2 * rho ** 2 / (1 + rho) / (2 * mu - lam)
    assert np.mean(start - arrival) == pytest.approx(expected, rel=0.03)


def _figures(k: int, gbps: float, case: str) -> dict:
    return {"k": k, "per_mover_gbps": gbps, "rows": [case]}


def test_link_contention_comes_from_the_rows_and_names_them():
    contention = {"host-gather/memcpy": {1: _figures(1, 10.0, "c1"), 2: _figures(2, 8.0, "c2"),
                                         4: _figures(4, 5.0, "c4")}}
    samples = {"c1": [1.0, 1.0, 2.0], "c2": [1.0, 3.0, 3.0]}
    frame = pd.DataFrame([{"case_id": c, "ns": v} for c, vs in samples.items() for v in vs])
    link = link_contention("host-gather/memcpy", contention, frame)
    assert link.rows == ("c1", "c2", "c4") and link.ks == (1, 2, 4)
    assert link.rate(1) == 1.0 and link.rate(2) == pytest.approx(0.8)
    assert link.rate(3) == pytest.approx(0.65)  # linear in k between the measured
    assert link.rate(8) == pytest.approx(0.5 * 4 / 8)  # past k = 4: the link saturated there
    assert link.aggregate(4).tolist() == pytest.approx([1.0, 1.6, 1.95, 2.0])
    assert sorted(link.spread(2).tolist()) == pytest.approx([1 / 3, 1.0, 1.0])
    assert link.spread(5) is link.spread(2)  # k = 4 has no samples: the nearest below with some
    assert "c2" in link.describe()
    assert link_contention("pool-gather/memcpy", contention, frame) is None
    assert link_contention("host-gather/memcpy", {"host-gather/memcpy": {
        1: _figures(1, 10.0, "c1")}}) is None  # k = 1 alone says nothing of contention


def test_simulate_with_movers_uses_the_measured_rates():
    contention = {"w": {1: _figures(1, 10.0, "a"), 2: _figures(2, 5.0, "b")}}
    link = link_contention("w", contention)
    arrival, transfer = np.zeros(2), np.ones(2)
    two = simulate(arrival, transfer, movers=2, contention=link)
    assert two.wait.tolist() == [0.0, 0.0] and two.transfer.tolist() == [2.0, 2.0]
    assumed = simulate(arrival, transfer, movers=2)
    assert assumed.transfer.tolist() == [1.0, 1.0]
    with pytest.raises(UsageError, match="movers-per-link"):
        Setup(movers=0).check()
