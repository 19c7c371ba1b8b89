"""Checks the what-if's path model against a real measurement of the read it predicts.

The model is fitted from a stored run's rows (small reads: a 64 KiB and a 64 MiB transfer,
a few hundred fragments); this script then measures the whole request's read with
`nearlocal run` (the same method, region and peer, the request's own kv: pattern, e.g. B16's
131072 x 32 KiB = 4 GiB) and prints predicted / measured per method. A ratio near 1 says the
model's terms (a per call, c(s) per fragment) carry from the rows it was fitted on to a read
60-250x larger; the ratio is the figure to quote beside any what-if of that box.

    python3 scripts/whatif_check.py --run RUN --out ROOT --method cuda-memcpy-batch \\
        --method gather-kernel --region pinned --peer gpu:0 [--model M --context 16k]
    python3 scripts/whatif_check.py --run latest --method memcpy --region dram --peer dram \\
        --model llama-3.1-8b --context 4k          # the CPU side, on any box

Writes whatif_check.json into --json-out when given. Exit 0 when every method was measured
(the ratios are reported, not judged), 1 when a measurement failed, 2 on bad input.
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
from nearlocal.whatif.serving import shape_of


def _model_for(models: dict, method: str, region: str, peer: str):
    for hop_models in models.values():
        for model in hop_models:
            if model.way.split(" [")[0] == f"{method} {region} -> {peer}":
                return model
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default=None, help="the run the model is fitted from")
    parser.add_argument("--out", default="results", help="the store's root")
    parser.add_argument("--method", action="append", required=True)
    parser.add_argument("--region", required=True)
    parser.add_argument("--peer", required=True)
    parser.add_argument("--model", default="qwen2.5-32b")
    parser.add_argument("--context", default="16k")
    parser.add_argument("--budget", default="1")
    parser.add_argument("--json-out", help="directory for whatif_check.json")
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
    results, status = [], 0
    for method in args.method:
        model = _model_for(models, method, args.region, args.peer)
        if model is None:
            print(f"{method}: the run has no rows of {method} {args.region} -> {args.peer}")
            status = 1
            continue
        predicted = model.predict(shape.fragments, shape.fragment_bytes)
        json_path = Path(args.out) / f"whatif-check-{method}.json"
        command = [sys.executable, "-m", "nearlocal", "run", "--method", method, "--region",
                   args.region, "--peer", args.peer, "--pattern", shape.pattern,
                   "--processes", "1", "--budget", args.budget, "--out", args.out,
                   "--json", str(json_path)]
        done = subprocess.run(command, capture_output=True, text=True)
        rows = json.loads(json_path.read_text()) if json_path.exists() else []
        # a method whose suite template also writes (memcpy) gives a scatter row too: the read
        row = next((r for r in rows if r.get("status") == "ok" and r.get("access") == "read"),
                   None)
        if row is None:
            reason = rows[0].get("reason") if rows else done.stderr.strip().splitlines()[-1:]
            print(f"{method}: not measured: {reason}")
            status = 1
            continue
        ratio = predicted.ns / row["median_ns"]
        results.append({"method": method, "region": args.region, "peer": args.peer,
                        "pattern": shape.pattern, "predicted_ns": predicted.ns,
                        "measured_ns": row["median_ns"], "predicted_over_measured": ratio,
                        "fitted_from": list(predicted.rows), "notes": list(predicted.notes),
                        "measured_case": row["case_id"]})
        print(f"{method}: predicted {format_ns(predicted.ns)}, measured "
              f"{format_ns(row['median_ns'])} (median, {int(row['n_samples'])} samples): "
              f"predicted / measured = {ratio:.3f}")
        for note in predicted.notes:
            print(f"  note: {note}")
    if args.json_out:
        Path(args.json_out, "whatif_check.json").write_text(json.dumps(results, indent=2))
    return status


if __name__ == "__main__":
    sys.exit(main())
