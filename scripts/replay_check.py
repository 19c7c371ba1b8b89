#!/usr/bin/env python3
"""Issue 57 item 3: is the serving simulation right about a queue the box really serves?

On this box: (a) measure the rows the simulation stands on (memcpy out of the pool's region,
dram by default: the host gather; `--region devdax:/dev/daxX.Y` or another host region: the pool
path; in fragments of the size the replay's layout cut gives, at k = 1, 2, ... movers: `nearlocal
run --suite contention --method memcpy --region REGION --pattern NxF`; or reuse `--run`); (b)
replay the trace's reloads out of that region (`nearlocal replay --region REGION --load U`) at
three utilisations; (c) feed the
simulation that run's rows and the replay's own requests (the same window, time scale, arrivals,
bytes and fragments per request, and G); (d) per load: replay and simulated reload P50 / P99
(wait + transfer over the requests with hits), their ratios, pass / fail (P50 within 15 %, P99
within 25 %), the rows named and the wall time. Exit 1 when a load fails; bad input is one line,
exit 2.

Two diagnostics beside the check: each request's transfer predicted from the rows vs. what the
replay measured for it (is the fit right at these sizes?), and the simulation fed the replay's
own transfers (is the queue model right, whatever the fit?).

    python scripts/replay_check.py --movers 1 --seconds 60 --json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nearlocal.errors import UsageError  # noqa: E402

DEFAULT_TRACE = ROOT / "nearlocal" / "data" / "traces" / "mooncake-conversation.jsonl"
DEFAULT_LOADS = (0.3, 0.6, 0.85)
P50_TOLERANCE, P99_TOLERANCE = 0.15, 0.25
ROW_SPAN_LLC = 5  # the rows' pattern spans this many LLCs (a reload comes from memory)
METHOD = "memcpy"  # the replay's movers gather with it


# ---------------------------------------------------------------------------------------------
# The comparison (pure: replay JSON and the rows' figures in, verdict out)


def percentiles_ns(values: np.ndarray) -> dict:
    """P50 / P99 as the replay computes them (numpy's linear percentiles)."""
    if not len(values):
        return {"p50_ns": None, "p99_ns": None}
    p50, p99 = np.percentile(np.asarray(values, float), [50, 99])
    return {"p50_ns": float(p50), "p99_ns": float(p99)}


def _ratio(sim: float | None, real: float | None) -> float | None:
    return None if not sim or not real else sim / real


def simulated_reloads(arrival_s: np.ndarray, transfer_s: np.ndarray, movers: int,
                      contention=None, spread: np.ndarray | None = None,
                      seed: int = 0) -> np.ndarray:
    """Each request's reload (wait + transfer, s) as the serving simulation serves it: one link,
    `movers` movers on its queue; `transfer_s` a request's time alone (0: no hit). One mover:
    each transfer scaled by a draw of `spread` (the k = 1 rows' samples over their median), as
    `serve` does; G movers: `simulate` draws each job's spread at its k from `contention`."""
    from nearlocal.whatif.load import simulate

    transfer = np.asarray(transfer_s, float)
    if movers == 1 and spread is not None and len(spread):
        rng = np.random.default_rng((seed, 1))
        transfer = transfer * rng.choice(spread, len(transfer))
    timeline = simulate(np.asarray(arrival_s, float), transfer, movers=movers,
                        contention=contention, seed=seed)
    return timeline.wait + timeline.transfer


def compare(replay: dict, alone_s: np.ndarray, contention=None, spread=None,
            seed: int = 0) -> dict:
    """One load: the replay's per-request records against the simulation fed the same requests
    (the replay's arrivals; `alone_s`, each request's transfer alone from the rows) and against
    the simulation fed the replay's own transfers; P50 within 15 %, P99 within 25 %."""
    records = replay["per_request"]
    movers = int(replay["movers"])
    arrival = np.array([r["arrival_ns"] for r in records], float) / 1e9
    moved = np.array([r["bytes"] > 0 for r in records])
    real_transfer = np.array([r["transfer_ns"] for r in records], float) / 1e9
    real = np.array([r["wait_ns"] + r["transfer_ns"] for r in records], float)[moved]
    alone = np.where(moved, np.asarray(alone_s, float), 0.0)
    sim = simulated_reloads(arrival, alone, movers, contention, spread, seed)[moved] * 1e9
    oracle = simulated_reloads(arrival, np.where(moved, real_transfer, 0.0), movers,
                               None, None, seed)[moved] * 1e9
    median = simulated_reloads(arrival, alone, movers,
                               None if contention is None else contention.without_spread(),
                               None, seed)[moved] * 1e9
    real_q, sim_q, oracle_q = percentiles_ns(real), percentiles_ns(sim), percentiles_ns(oracle)
    median_q = percentiles_ns(median)
    p50 = _ratio(sim_q["p50_ns"], real_q["p50_ns"])
    p99 = _ratio(sim_q["p99_ns"], real_q["p99_ns"])
    ok = (p50 is not None and p99 is not None and abs(p50 - 1) <= P50_TOLERANCE
          and abs(p99 - 1) <= P99_TOLERANCE)
    per_request = (real_transfer[moved] / alone[moved]) if moved.any() else np.zeros(0)
    return {
        "load": replay.get("load"), "time_scale": replay.get("time_scale"),
        "utilisation": replay.get("utilisation"), "movers": movers,
        "requests": len(records), "requests_with_hits": int(moved.sum()),
        "bytes": int(sum(r["bytes"] for r in records)),
        "replay_reload": real_q, "simulated_reload": sim_q,
        "p50_ratio": p50, "p99_ratio": p99, "pass": bool(ok),
        "tolerance": {"p50": P50_TOLERANCE, "p99": P99_TOLERANCE},
        "fit": {  # the rows' prediction of each transfer vs the replay's own
            "predicted_transfer_p50_ns": float(np.median(alone[moved]) * 1e9) if moved.any()
            else None,
            "replay_transfer_p50_ns": float(np.median(real_transfer[moved]) * 1e9)
            if moved.any() else None,
            "replay_over_predicted": {
                q: float(np.percentile(per_request, p)) for q, p in
                (("p10", 10), ("p50", 50), ("p90", 90))} if per_request.size else {},
        },
        "simulated_from_replay_transfers": {
            **oracle_q, "p50_ratio": _ratio(oracle_q["p50_ns"], real_q["p50_ns"]),
            "p99_ratio": _ratio(oracle_q["p99_ns"], real_q["p99_ns"])},
        "simulated_without_spread": {  # every transfer its rows' median: what the spread adds
            **median_q, "p50_ratio": _ratio(median_q["p50_ns"], real_q["p50_ns"]),
            "p99_ratio": _ratio(median_q["p99_ns"], real_q["p99_ns"])},
    }


def exit_code(loads: list[dict]) -> int:
    return 0 if loads and all(entry["pass"] for entry in loads) else 1


# ---------------------------------------------------------------------------------------------
# The box's side


def replay_namespace(args: argparse.Namespace, layers: str | None) -> argparse.Namespace:
    return argparse.Namespace(model=args.model, layout=args.layout, tp=None, block_tokens=None,
                              dtype=None, order=None, layers=layers)


def cut(args: argparse.Namespace, layers: str | None, llc: int, trace, hits, window):
    """The window's requests cut as the replay cuts them, on the pool it lays on the region
    (its refusals too, before anything is measured): (bytes, fragments) per request."""
    from nearlocal.frontends.replay import choose_pool, pattern_text
    from nearlocal.workloads import replay

    pool, want, _ = choose_pool(pattern_text(replay_namespace(args, layers)), llc,
                                args.pool_bytes, args.region)
    tables, cursor = [], 0
    for tokens in hits.tokens[window].tolist():
        table, cursor = replay.request_table(pool, int(tokens), cursor)
        tables.append(table)
    frags, first, nbytes = replay.cut_requests(pool, tables, want // args.movers)
    return nbytes, np.diff(first), frags, pool


def _nearlocal(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nearlocal", *argv], cwd=ROOT,
                          capture_output=True, text=True)


def measure_rows(args: argparse.Namespace, pattern: str, out: Path) -> str:
    """The contention suite narrowed to memcpy on the pool's region at the replay's fragment
    size."""
    processes = ["--processes", str(args.processes)] if args.processes else []
    done = _nearlocal(["run", "--suite", "contention", "--method", METHOD, "--region",
                       args.region, "--pattern", pattern, "--budget", f"{args.budget:g}",
                       *processes, "--out", str(out), "--quiet"])
    if done.returncode:
        raise SystemExit(f"replay_check: nearlocal run failed: {done.stderr.strip()[-400:]}")
    from nearlocal.store.catalogue import resolve_run

    return str(resolve_run(None, out))


def run_replay(args: argparse.Namespace, load: float, layers: str, out: Path) -> tuple[dict, float]:
    began = time.monotonic()
    argv = ["replay", "--trace", str(args.trace), "--start", f"{args.start:g}", "--seconds",
            f"{args.seconds:g}", "--movers", str(args.movers), "--model", args.model,
            "--layout", args.layout, "--layers", layers, "--load", f"{load:g}",
            "--region", args.region, "--out", str(out)]
    if args.pool_bytes:
        argv += ["--pool-bytes", args.pool_bytes]
    done = _nearlocal(argv)
    if done.returncode:
        raise SystemExit(f"replay_check: nearlocal {' '.join(argv)} failed: "
                         f"{done.stderr.strip()[-400:]}")
    return json.loads(out.read_text()), time.monotonic() - began


def _same_params(row: dict, params: dict) -> bool:
    """The row was measured with the replay's own params (both with their defaults: the row's
    effective params): an mtu=4096 or sge=one row does not stand for a replay at the defaults.
    movers=k is not among them: the contention rows differ from the replay only in k."""
    from nearlocal.params import decode_params_or_none

    effective = decode_params_or_none(row.get("effective_params"))
    return all(str(effective.get(key, value)) == str(value) for key, value in params.items())


def way_of_region(run, region: str, method: str = METHOD,
                  params: dict | None = None) -> tuple[str, set]:
    """The way (`hop/memcpy`, as contention_of keys it; `rdma/rdma-read` for the RDMA replay's
    rows) the run's `method` rows out of `region` with the replay's `params` stand for, and
    those rows' case ids: the simulation is fed the rows of the replay's region, method and
    params only, whatever else the run holds."""
    from nearlocal.whatif.contention import way_of
    from nearlocal.whatif.paths import HOPS

    rows = [row for row in run.cases.to_dict("records") if row.get("region") == region
            and row.get("method") == method and row.get("status") == "ok"
            and _same_params(row, params or {})]
    ways = {way_of(row) for row in rows}
    if len(ways) != 1 or next(iter(ways)).split("/")[0] not in HOPS:
        raise UsageError(f"the run has no {method} rows out of {region} that a hop of the "
                         f"what-if takes (saw {sorted(ways) or 'none'}): measure them, or leave "
                         "--run out")
    return ways.pop(), {str(row["case_id"]) for row in rows}


def predicted_alone(models, nbytes: np.ndarray, fragments: np.ndarray) -> tuple[np.ndarray, set]:
    """Each request's transfer alone (s) by the fitted gather (serving.best_way, as the
    what-if takes it): its own fragment count at its mean fragment size."""
    from nearlocal.whatif.serving import best_way

    out, rows, cache = np.zeros(len(nbytes)), set(), {}
    for i, (b, n) in enumerate(zip(nbytes.tolist(), fragments.tolist(), strict=True)):
        if b <= 0:
            continue
        key = (int(n), round(b / n))
        if key not in cache:
            found = best_way(models, key[0], key[1], gather=key[0] > 1)
            if found is None:
                raise UsageError("the run has no gather row (memcpy out of the region in "
                                 "fragments): measure one, or leave --run out")
            cache[key] = found[1]
        out[i] = cache[key].ns / 1e9
        rows.update(cache[key].rows)
    return out, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=str(DEFAULT_TRACE))
    parser.add_argument("--run", help="reuse this run's rows (a run dir or id) instead of "
                        "measuring them")
    parser.add_argument("--movers", type=int, default=1, help="G, the replay's movers")
    parser.add_argument("--start", type=float, default=600.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--loads", default=",".join(map(str, DEFAULT_LOADS)))
    parser.add_argument("--model", default="qwen2.5-32b")
    parser.add_argument("--layout", default="flash-attn")
    parser.add_argument("--layers", help="layers A-B replayed (default: as many as let the "
                        "lowest load replay in about --seconds of wall time, from the rows)")
    parser.add_argument("--budget", type=float, default=2.0, help="the rows' budget per case")
    parser.add_argument("--processes", type=int, help="the rows' worker processes per case "
                        "(default: run's)")
    parser.add_argument("--region", default="dram", help="the pool's host region: the rows' "
                        "and the replay's source (default dram: the host gather)")
    parser.add_argument("--pool-bytes", help="the replay's --pool-bytes (default: its own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replay", help="a replay already made (its --out JSON, e.g. the RDMA "
                        "replay of an MPI job): predict it from --run's rows, run nothing")
    parser.add_argument("--method", default=METHOD, help="with --replay: the rows' method "
                        "(memcpy, or rdma-read for `nearlocal replay --method rdma-read`)")
    parser.add_argument("--out", help="keep the rows and replays here (default: a temp dir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    began = time.monotonic()
    try:
        if args.replay:
            return _check_given(args, began)
        return _check(args, began)
    except UsageError as exc:
        print(f"replay_check: {exc}", file=sys.stderr)
        return 2


def _check(args: argparse.Namespace, began: float) -> int:
    from nearlocal.frontends.replay import window_of
    from nearlocal.store import load as load_run
    from nearlocal.whatif import inputs_of
    from nearlocal.whatif.contention import contention_of
    from nearlocal.whatif.load import link_contention, sample_spread
    from nearlocal.whatif.traffic import prefix_hits, read_trace

    try:
        loads = [float(x) for x in args.loads.split(",")]
    except ValueError:
        raise UsageError(f"--loads {args.loads}: a comma list of utilisations") from None
    if not all(0 < u < 1 for u in loads):
        raise UsageError(f"--loads {args.loads}: utilisations between 0 and 1")
    if args.movers < 1 or args.movers > len(os.sched_getaffinity(0)):
        raise UsageError(f"--movers {args.movers}: 1 to the CPUs this process may use")
    if not os.path.isfile(args.trace):
        raise UsageError(f"--trace {args.trace}: no such file")
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="replay-check-"))
    work.mkdir(parents=True, exist_ok=True)
    from nearlocal.frontends.replay import replay_box

    llc = replay_box()[1]  # the LLC the replay sizes its pool by
    trace = read_trace(args.trace)
    hits = prefix_hits(trace)
    window = window_of(trace, args.start, args.seconds)
    if not window.size:
        raise UsageError(f"--start {args.start:g}: no request there")
    nbytes, fragments, frags, pool = cut(args, args.layers, llc, trace, hits, window)
    if not frags.size:
        raise UsageError("the window's requests hit nothing: nothing to reload")
    sizes, counts = np.unique(frags[:, 2], return_counts=True)
    fragment = int(sizes[np.argmax(counts)])  # the cut's commonest fragment
    pattern = f"{-(-ROW_SPAN_LLC * llc // fragment)}x{fragment}B"

    rows_began = time.monotonic()
    run_ref = args.run or measure_rows(args, pattern, work / "rows")
    rows_wall = time.monotonic() - rows_began
    run = load_run(run_ref)
    way, ids = way_of_region(run, args.region)
    inputs = inputs_of(run)
    models = [m for m in inputs.measured.get(way.split("/")[0]) or [] if set(m.rows) <= ids]
    figures = contention_of(run.cases[run.cases["case_id"].isin(ids)], run.samples)
    link = link_contention(way, figures, run.samples)
    at_k = figures.get(way, {})
    if args.movers > 1 and link is None:
        print(f"replay_check: the run has no movers=k rows of {way}: a mover's rate is taken as "
              "1 at every k (an assumption)", file=sys.stderr)

    layers = args.layers
    model_layers = pool.geometry.model.layers
    if layers is None:  # all layers unless the lowest load would take past --seconds of wall
        gbps = (at_k.get(args.movers) or at_k.get(1) or {}).get("per_mover_gbps") or 0.0
        full = float(nbytes.sum()) * model_layers / max(1, int(pool.layers.size))
        scale = full / (min(loads) * args.movers * gbps * 1e9 * args.seconds) if gbps else 1.0
        count = model_layers if scale <= 1 else max(1, math.floor(model_layers / scale))
        layers = f"0-{count - 1}"
    nbytes, fragments, _, _ = cut(args, layers, llc, trace, hits, window)
    alone, fit_rows = predicted_alone(models, nbytes, fragments)
    spread_rows = tuple(sorted(fit_rows))
    spread = sample_spread(run.samples, spread_rows)

    results = []
    for u in loads:
        replay, wall = run_replay(args, u, layers, work / f"replay-{u:g}.json")
        records = replay["per_request"]
        same = {
            "requests": len(records) == len(window),
            "hit_tokens": [r["hit_tokens"] for r in records] == hits.tokens[window].tolist(),
            "bytes": [r["bytes"] for r in records] == nbytes.tolist(),
            "fragments": [r["fragments"] for r in records] == fragments.tolist(),
        }
        offsets = (trace.arrival_s[window] - trace.arrival_s[0] - args.start) \
            * replay["time_scale"] * 1e9
        same["arrival_max_diff_ns"] = float(np.abs(
            np.array([r["arrival_ns"] for r in records]) - offsets).max())
        entry = compare(replay, alone, link if args.movers > 1 else None, spread, args.seed)
        entry.update(same_requests=same, replay_wall_s=replay.get("wall_s"),
                     replay_moved_gbps=replay.get("moved_gbps"),
                     replay_command_wall_s=wall, replay_json=str(work / f"replay-{u:g}.json"),
                     calibration=replay.get("calibration"), replay_path=replay.get("path"),
                     pool_note=replay.get("pool_note"))
        if not all(v for k, v in same.items() if k != "arrival_max_diff_ns") \
                or same["arrival_max_diff_ns"] > 1e3:
            entry["pass"] = False
            entry["why"] = "the simulation's requests are not the replay's"
        results.append(entry)

    out = {
        "trace": str(args.trace), "start_s": args.start, "seconds": args.seconds,
        "movers": args.movers, "model": args.model, "layout": args.layout, "layers": layers,
        "region": args.region, "way": way, "emulated": inputs.emulated,
        "llc_bytes": llc, "rows_pattern": pattern, "run": str(run_ref),
        "rows_wall_s": None if args.run else rows_wall,
        "transfer_rows": list(spread_rows),
        "contention_rows": list(link.rows) if link else [],
        "contention": _contention_summary(at_k),
        "model_notes": sorted({n for m in models for n in m.notes}),
        "loads": results, "wall_s": time.monotonic() - began,
    }
    return _finish(out, args.json)


def _check_given(args: argparse.Namespace, began: float) -> int:
    """--replay: one replay already made, its requests (bytes, fragments, arrivals, G) taken
    from its own records, predicted from --run's rows of its method out of --region (for the
    RDMA replay the rows of `nearlocal run --suite rdma` / `contention` on the same pair of
    ranks: way rdma/rdma-read), compared as a load of the full check is."""
    from nearlocal.store import load as load_run
    from nearlocal.whatif import inputs_of
    from nearlocal.whatif.contention import contention_of
    from nearlocal.whatif.load import link_contention, sample_spread

    if not args.run:
        raise UsageError("--replay needs --run, the rows to predict it from")
    try:
        replay = json.loads(Path(args.replay).read_text())
        records = replay["per_request"]
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"--replay {args.replay}: not a replay's JSON ({exc})") from None
    run = load_run(args.run)
    region = replay.get("region") or args.region
    way, ids = way_of_region(run, region, args.method, replay.get("params"))
    inputs = inputs_of(run)
    models = [m for m in inputs.measured.get(way.split("/")[0]) or [] if set(m.rows) <= ids]
    figures = contention_of(run.cases[run.cases["case_id"].isin(ids)], run.samples)
    link = link_contention(way, figures, run.samples)
    movers = int(replay["movers"])
    nbytes = np.array([r["bytes"] for r in records], np.int64)
    fragments = np.array([r.get("fragments", 0) for r in records], np.int64)
    alone, fit_rows = predicted_alone(models, nbytes, fragments)
    spread_rows = tuple(sorted(fit_rows))
    entry = compare(replay, alone, link if movers > 1 else None,
                    sample_spread(run.samples, spread_rows), args.seed)
    entry.update(replay_json=str(args.replay), replay_path=replay.get("path"),
                 replay_wall_s=replay.get("wall_s"), replay_moved_gbps=replay.get("moved_gbps"),
                 calibration=replay.get("calibration"), pool_note=replay.get("pool_note"),
                 data_check=replay.get("data_check"))
    emulated = "; ".join(n for n in (inputs.emulated, replay.get("emulated")) if n)
    out = {
        "trace": replay.get("trace"), "start_s": replay.get("start_s"),
        "seconds": replay.get("seconds"), "movers": movers, "model": replay.get("model"),
        "layout": replay.get("layout"), "layers": replay.get("layers"), "region": region,
        "method": args.method, "way": way, "emulated": emulated,
        "llc_bytes": replay.get("llc_bytes"), "rows_pattern": "-", "run": str(args.run),
        "rows_wall_s": None, "transfer_rows": list(spread_rows),
        "contention_rows": list(link.rows) if link else [],
        "contention": _contention_summary(figures.get(way, {})),
        "model_notes": sorted({n for m in models for n in m.notes}),
        "loads": [entry], "wall_s": time.monotonic() - began,
    }
    return _finish(out, args.json)


def _contention_summary(at_k: dict) -> dict:
    """Per k, the figures the simulation's link stood on (contention_of's), as the output says."""
    return {str(k): {"per_mover_gbps": v.get("per_mover_gbps"),
                     "aggregate_gbps": v.get("aggregate_gbps"), "rows": v.get("rows"),
                     "service_p50_ns": v["service_ns"].get("p50_ns"),
                     "service_p99_ns": v["service_ns"].get("p99_ns")} for k, v in at_k.items()}


def _finish(out: dict, as_json: bool) -> int:
    """The verdict over the output's loads, printed as JSON or for a person; the exit code."""
    code = exit_code(out["loads"])
    out["pass"] = code == 0
    if as_json:
        print(json.dumps(out, indent=1))
    else:
        _print(out)
    return code


def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.1f} ms"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _print(out: dict) -> None:
    print(f"replay check: {out['trace']} from {out['start_s']:g} s for {out['seconds']:g} s, "
          f"G = {out['movers']}, {out['model']} {out['layout']} layers {out['layers']}; rows "
          f"{out['rows_pattern']} {out['way']} out of {out['region']} (run {out['run']})")
    if out["emulated"]:
        print(f"  NOTE: {out['emulated']}")
    for k, v in out["contention"].items():
        print(f"  k={k}: {v['per_mover_gbps']:.2f} GB/s a mover, service P50 "
              f"{_ms(v['service_p50_ns'])} P99 {_ms(v['service_p99_ns'])} ({', '.join(v['rows'])})")
    for e in out["loads"]:
        fit = e["fit"]
        oracle = e["simulated_from_replay_transfers"]
        asked = "-" if e["load"] is None else format(e["load"], "g")
        print(f"  load {asked} (time x{e['time_scale']:.3f}, utilisation "
              f"{_x(e['utilisation'])}, {e['requests_with_hits']} reloads): replay P50 "
              f"{_ms(e['replay_reload']['p50_ns'])} P99 {_ms(e['replay_reload']['p99_ns'])}; "
              f"simulated P50 {_ms(e['simulated_reload']['p50_ns'])} P99 "
              f"{_ms(e['simulated_reload']['p99_ns'])}; ratios {_x(e['p50_ratio'])} / "
              f"{_x(e['p99_ratio'])}: {'PASS' if e['pass'] else 'FAIL'}"
              f"{' (' + e['why'] + ')' if e.get('why') else ''}")
        print(f"    transfer: predicted P50 {_ms(fit['predicted_transfer_p50_ns'])}, replay "
              f"{_ms(fit['replay_transfer_p50_ns'])} (replay / predicted per request P10/50/90 "
              + "/".join(_x(v) for v in fit["replay_over_predicted"].values())
              + f"); simulated from the replay's transfers: ratios {_x(oracle['p50_ratio'])} / "
              f"{_x(oracle['p99_ratio'])}; with every transfer its rows' median: ratios "
              f"{_x(e['simulated_without_spread']['p50_ratio'])} / "
              f"{_x(e['simulated_without_spread']['p99_ratio'])}; the replay moved "
              f"{_x(e['replay_moved_gbps'])} GB/s a mover (its calibration "
              f"{_x((e['calibration'] or {}).get('gbps_per_mover'))}); replay wall "
              f"{e['replay_wall_s']:.1f} s")
        if e.get("pool_note"):
            print(f"    NOTE: {e['pool_note']}")
    print(f"  rows: {', '.join(out['transfer_rows'])}; contention: "
          f"{', '.join(out['contention_rows']) or '-'}; wall {out['wall_s']:.1f} s: "
          f"{'PASS' if out['pass'] else 'FAIL'}")


if __name__ == "__main__":
    sys.exit(main())
