"""Checks the what-if's path model against a real measurement of the read it predicts.

The model is fitted from a stored run's rows (small reads: a 64 KiB and a 64 MiB transfer,
a few hundred fragments); this script then measures the whole request's read with
`nearlocal run` (the same method, region and peer, the request's own kv: pattern, e.g. B16's
131072 x 32 KiB = 4 GiB) and prints predicted / measured per way. A ratio near 1 says the
model's terms (a per call, c(s) per fragment) carry from the rows it was fitted on to a read
60-250x larger; the ratio is the figure to quote beside any what-if of that box.

Every way the model can choose is checked (every method the run moved region -> peer with, or
those --method names), not only the one the what-if picks, which is printed. A way whose method
cannot gather (it only writes: nt-copy, a scatter) never stands for the request's gather; it is
checked on what the what-if can pick it for, one contiguous transfer of the same bytes. Each
figure is set beside the box's ceiling for the source (its best read of that region from
memory in the run, fit.read_ceilings), and a prediction above it is a failure.

    python3 scripts/whatif_check.py --run RUN --out ROOT --method cuda-memcpy-batch \\
        --method gather-kernel --region pinned --peer gpu:0 [--model M --context 16k]
    python3 scripts/whatif_check.py --run latest --region dram --peer dram \\
        --model llama-3.1-8b --context 4k          # the CPU side, on any box: memcpy, nt-copy
    ... --fresh quick    # a shared box: each way's rows measured again just before its read

Writes whatif_check.json into --json-out when given. Exit 0 when every way was measured and no
prediction exceeds the ceiling (the ratios are reported, not judged), 1 when a measurement
failed or a prediction beat the box, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from nearlocal.errors import UsageError
from nearlocal.store import load
from nearlocal.units import format_ns
from nearlocal.whatif import Request
from nearlocal.whatif.commands import parse_tokens
from nearlocal.whatif.fit import fit_run
from nearlocal.whatif.serving import best_way, shape_of

CHECK_STORE = "whatif-check"  # under --out: the runs this script measures


def _ways(models: dict, region: str, peer: str, methods: list[str] | None) -> list:
    """Every fitted way moving region -> peer (of `methods`, when named), in the run's order."""
    found = []
    for hop_models in models.values():
        for model in hop_models:
            method, _, rest = model.way.partition(" ")
            if rest.split(" [")[0] == f"{region} -> {peer}" and (not methods or method in methods):
                found.append((method, model))
    return found


def _measure(args, method: str, pattern: str, gather: bool) -> tuple[dict | None, str]:
    """The ok row of `nearlocal run` on `pattern` (a gather: its read row), or why none."""
    checks = Path(args.out) / CHECK_STORE  # the measurements' own store: `latest` in --out
    checks.mkdir(parents=True, exist_ok=True)  # stays the run the model was fitted from
    json_path = checks / f"whatif-check-{method}.json"
    json_path.unlink(missing_ok=True)
    command = [sys.executable, "-m", "nearlocal", "run", "--method", method, "--region",
               args.region, "--peer", args.peer, "--pattern", pattern,
               "--processes", "1", "--budget", args.budget, "--out", str(checks),
               "--json", str(json_path)]
    done = subprocess.run(command, capture_output=True, text=True)
    rows = json.loads(json_path.read_text()) if json_path.exists() else []
    # a method whose suite template also writes (memcpy) gives a scatter row too: the read
    row = next((r for r in rows if r.get("status") == "ok"
                and (r.get("access") == "read" or not gather)), None)
    if row is None:
        reason = rows[0].get("reason") if rows else done.stderr.strip().splitlines()[-1:]
        return None, str(reason)
    return row, ""


def _refit(args, method: str, model):
    """`method`'s way fitted from a run of its rows (and the box's reads, for the ceiling)
    measured now; (None, why) when that run gave none."""
    command = [sys.executable, "-m", "nearlocal", "run", "--suite", args.fresh, "--method",
               f"{method},load", "--region", args.region, "--peer", args.peer, "--attr", "wb",
               "--out", args.out, "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True)
    stored = [line.split("/")[-1] for line in done.stdout.splitlines()
              if line.startswith("stored ")]
    if not stored:
        return None, (done.stderr.strip().splitlines() or ["no run stored"])[-1]
    run = load(stored[-1], Path(args.out))
    found = [m for hop in fit_run(run.cases).values() for m in hop if m.way == model.way]
    return (found[0], run.run_id) if found else (None, f"run {run.run_id} has no {model.way}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default=None, help="the run the model is fitted from")
    parser.add_argument("--out", default="results", help="the store's root")
    parser.add_argument("--method", action="append",
                        help="the ways to check (default: every method the run moved "
                             "region -> peer with)")
    parser.add_argument("--region", required=True)
    parser.add_argument("--peer", required=True)
    parser.add_argument("--model", default="qwen2.5-32b")
    parser.add_argument("--context", default="16k")
    parser.add_argument("--budget", default="1")
    parser.add_argument("--json-out", help="directory for whatif_check.json")
    parser.add_argument("--fresh", metavar="SUITE",
                        help="before each way's read, measure that way's rows again with "
                             "`nearlocal run --suite SUITE --method M,load --attr wb` (e.g. "
                             "quick) and fit from them: on a shared box the fit and the read then "
                             "see the same neighbours, not those of a run minutes earlier")
    args = parser.parse_args(argv)
    try:
        run = load(args.run, Path(args.out))
        models = fit_run(run.cases)
        request = Request(model=args.model, context=parse_tokens(args.context))
        shape = shape_of(request)
    except UsageError as exc:
        print(f"whatif_check: {exc}", file=sys.stderr)
        return 2
    print(f"model fitted from run {run.run_id}; the request's read: {shape.fragments} x "
          f"{shape.fragment_bytes} B = {shape.total_bytes / 2**30:.2f} GiB ({shape.pattern})")
    ways = _ways(models, args.region, args.peer, args.method)
    gather = shape.fragments > 1
    picked = best_way([m for _, m in ways], shape.fragments, shape.fragment_bytes, gather)
    print("the what-if picks: " + (picked[0].way if picked else "no way (none can gather it)"))
    results, status = [], 0
    for method in args.method or []:
        if all(name != method for name, _ in ways):
            print(f"{method}: the run has no rows of {method} {args.region} -> {args.peer} "
                  "that stand for a reload")
            status = 1
    for method, model in ways:
        if gather and model.gathers:
            read, fragments, size = shape.pattern, shape.fragments, shape.fragment_bytes
        else:  # what the what-if can pick it for: the same bytes in one contiguous transfer
            read, fragments, size = f"{shape.total_bytes}B", 1, shape.total_bytes
            if gather:
                print(f"{method}: cannot gather the request's fragments (its method only "
                      "writes: a scatter), never picked for them; checked on one contiguous "
                      f"transfer of the same {shape.total_bytes / 2**20:.0f} MiB")
        if args.fresh:
            model, fresh_id = _refit(args, method, model)
            if model is None:
                print(f"{method}: not measured again: {fresh_id}")
                status = 1
                continue
            print(f"{method}: fitted again from run {fresh_id}, just before its read")
        predicted = model.predict(fragments, size)
        row, why = _measure(args, method, read, gather and model.gathers)
        if row is None:
            print(f"{method}: not measured: {why}")
            status = 1
            continue
        ratio = predicted.ns / row["median_ns"]
        gbps = fragments * size / predicted.ns
        ceiling = model.ceiling
        above = ceiling is not None and gbps > ceiling.bytes_per_ns * (1 + 1e-9)
        status = 1 if above else status
        results.append({"method": method, "region": args.region, "peer": args.peer,
                        "fitted_run": fresh_id if args.fresh else run.run_id,
                        "pattern": read, "predicted_ns": predicted.ns,
                        "measured_ns": row["median_ns"], "predicted_over_measured": ratio,
                        "predicted_gbps": gbps, "measured_gbps": row.get("gbps"),
                        "ceiling_gbps": ceiling.bytes_per_ns if ceiling else None,
                        "ceiling_row": ceiling.case_id if ceiling else None,
                        "above_ceiling": above, "picked": bool(picked and picked[0] is model),
                        "fitted_from": list(predicted.rows), "notes": list(predicted.notes),
                        "measured_case": row["case_id"]})
        print(f"{method} ({read}): predicted {format_ns(predicted.ns)} ({gbps:.2f} GB/s), "
              f"measured {format_ns(row['median_ns'])} (median, {int(row['n_samples'])} "
              f"samples): predicted / measured = {ratio:.3f}; rows {', '.join(predicted.rows)}")
        print("  ceiling: " + (f"{ceiling.note()}" + (": ABOVE IT" if above else ": within it")
                               if ceiling else "none in this run (no read of the source from "
                               "memory with as many threads)"))
        for note in predicted.notes:
            print(f"  note: {note}")
    if args.json_out:
        Path(args.json_out).mkdir(parents=True, exist_ok=True)
        Path(args.json_out, "whatif_check.json").write_text(json.dumps(results, indent=2))
    return status


if __name__ == "__main__":
    sys.exit(main())
