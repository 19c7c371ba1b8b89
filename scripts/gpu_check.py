"""The two comparisons the GPU check reports, measured in one process on a GPU box:

1. 64 MiB host -> device from pinned memory: nearlocal's cuda-memcpy-async (device time, CUDA
   events behind the blocking kernel) vs torch's pinned `copy_` of the same size timed with
   torch.cuda events (only when torch is importable). They should agree within 10 %.
2. 1024 fragments of 160 B (Beluga B14's sparse read) from pinned memory into gpu:0:
   gather-kernel (one launch) vs cuda-memcpy-async (one call per fragment), device and e2e time.

Writes gpu_check.json and report.md under --out and prints the report.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from nearlocal.harness.cases import Case
from nearlocal.harness.stats import StoppingRule
from nearlocal.harness.worker import WorkerSettings, measure
from nearlocal.units import format_ns

SETTINGS = WorkerSettings(StoppingRule(budget_s=1.0, target_rel_ci=0.01), 1e9, False)
BIG = 64 * 1024 * 1024


def _median(case: Case) -> dict:
    row, _, _ = measure(case, SETTINGS, 0.0)
    return {"case": case.id, "median_ns": row["median_ns"], "p99_ns": row["p99_ns"],
            "n": row["n_samples"], "gbps": row["gbps"], "info": row["info"]}


def torch_pinned_copy_ns(nbytes: int, reps: int = 30) -> float | None:
    """Median ns of torch's non-blocking pinned -> device copy_, by torch.cuda events."""
    try:
        import torch
    except Exception:
        return None
    if not torch.cuda.is_available():
        return None
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    for _ in range(3):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e6)
    return float(np.median(times))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/out")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {}
    lines = ["# nearlocal GPU check", ""]

    h2d = _median(Case("cuda-memcpy-async", "pinned", "wb", "64MiB", peer="gpu:0"))
    torch_ns = torch_pinned_copy_ns(BIG)
    report["h2d_64MiB"] = {"nearlocal": h2d, "torch_copy_ns": torch_ns}
    lines.append(f"64 MiB pinned -> gpu:0, cuda-memcpy-async: {format_ns(h2d['median_ns'])} "
                 f"({h2d['gbps']:.2f} GB/s)")
    if torch_ns is None:
        lines.append("torch is not importable (or sees no GPU): no torch comparison")
    else:
        ratio = h2d["median_ns"] / torch_ns
        report["h2d_64MiB"]["ratio"] = ratio
        report["h2d_64MiB"]["within_10_percent"] = bool(abs(ratio - 1) <= 0.10)
        lines.append(f"torch pinned copy_: {format_ns(torch_ns)} ({BIG / torch_ns:.2f} GB/s); "
                     f"nearlocal / torch = {ratio:.3f} "
                     f"({'within' if abs(ratio - 1) <= 0.10 else 'NOT within'} 10 %)")

    lines += ["", "1024 x 160 B pinned -> gpu:0 (Beluga B14's sparse read):", ""]
    lines.append("| timing | cuda-memcpy-async | gather-kernel | factor |")
    lines.append("|---|---|---|---|")
    for timing in ("device", "e2e"):
        params = (("timing", timing),)
        memcpy = _median(Case("cuda-memcpy-async", "pinned", "wb", "1024x160B", peer="gpu:0",
                              params=params))
        kernel = _median(Case("gather-kernel", "pinned", "wb", "1024x160B", peer="gpu:0",
                              params=params))
        factor = memcpy["median_ns"] / kernel["median_ns"]
        report[f"gather_1024x160B_{timing}"] = {"cuda-memcpy-async": memcpy,
                                                "gather-kernel": kernel, "factor": factor}
        lines.append(f"| {timing} | {format_ns(memcpy['median_ns'])} | "
                     f"{format_ns(kernel['median_ns'])} | {factor:.1f}x |")
    text = "\n".join(lines) + "\n"
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
