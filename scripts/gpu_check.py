"""The GPU check's figures and "what must hold" verdicts, measured in one process on a GPU box.

1. Side by side (issue 11 item 7): every host -> GPU method's median at 64 KiB and 64 MiB
   contiguous, 1024 x 160 B and 128 x 20 KiB, pinned -> gpu:0 (device time; e2e rows for
   cuda-memcpy-async and gather-kernel), with what each interval contains.
2. What must hold on an H200:
   - 64 MiB pinned H2D cuda-memcpy-async within 5 % of torch's pinned copy_ (torch.cuda events);
   - gather-kernel >= 0.85x cuda-memcpy-async's bandwidth at 64 MiB, <= 1.5x its time at 64 KiB;
   - gather-kernel e2e at 1024 x 160 B <= 1.5x a bare launch + sync of the same RawKernel
     (pieces already in device memory, arguments packed: the least a Python caller can pay);
   - every case of the suite JSON files is ok or skipped (`--suites-only --suite-json F...`,
     appended to the report by scripts/gpu_check.sh once the suites have run).
3. The 64 KiB device figure explained: cuda-memcpy-async 64 KiB with and without the 1-byte
   prime copy before the start event, beside a lone cudaMemcpyAsync between two events.

Writes gpu_check.json and report.md under --out, prints the report; exit 1 if a check fails.
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
from nearlocal.hwprobe.gpu import _one_line
from nearlocal.units import format_ns

SETTINGS = WorkerSettings(StoppingRule(budget_s=0.25, target_rel_ci=0.01), 1e9, False)
BIG = 64 * 1024 * 1024
PATTERNS = ("64KiB", "64MiB", "1024x160B", "128x20KiB")
METHODS = (("cuda-memcpy", "read", "device"), ("cuda-memcpy-async", "read", "device"),
           ("cuda-memcpy-async", "read", "e2e"), ("cuda-memcpy-batch", "read", "device"),
           ("cuda-memcpy-batch", "read", "e2e"),
           ("cuda-memcpy-2d", "read", "device"), ("gather-kernel", "read", "device"),
           ("gather-kernel", "read", "e2e"), ("zero-copy-kernel", "read", "device"),
           ("cuda-memcpy-async", "write", "device"), ("scatter-kernel", "write", "device"))
CONTAINS = ("device_contains", "e2e_contains")


def _row(method: str, pattern: str, access: str = "read", **params: str) -> dict:
    case = Case(method, "pinned", "wb", pattern, peer="gpu:0", access=access,
                params=tuple(params.items()))
    try:
        row, _, _ = measure(case, SETTINGS, 0.0)
    except Exception as exc:  # a failed cell is shown as failed, the table goes on
        return {"case": case.id, "error": _one_line(exc, 300)}
    return {"case": case.id, "median_ns": row["median_ns"], "p99_ns": row["p99_ns"],
            "n": row["n_samples"], "gbps": row["gbps"], "info": row["info"]}


def _cell(row: dict) -> str:
    if "error" in row:
        return "FAILED"
    return f"{format_ns(row['median_ns'])} ({row['gbps']:.1f} GB/s)"


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


def bare_launch_ns(pattern: str, reps: int = 300) -> tuple[float, list[float]]:
    """Host ns of one launch + stream sync of nl_copy for `pattern`, pinned -> device, with the
    pieces already in device memory and the arguments packed once, on the e2e rows' clock
    (timing.end_to_end, host_clock_overhead_ns() removed as from their samples): (median after
    a 10 % warm-up, every raw time)."""
    import cupy as cp

    from nearlocal.gpu import kernels, timing
    from nearlocal.workloads.patterns import parse_pattern

    table = kernels.validate_fragments(parse_pattern(pattern).frags)
    span = int((table[:, :2] + table[:, 2:3]).max()) + 64
    src_mem = cp.cuda.alloc_pinned_memory(span)
    src = np.frombuffer(src_mem, np.uint8, span)
    src[:] = np.arange(span) % 251
    dst = cp.zeros(span, dtype=cp.uint8)
    plan, pieces = kernels.plan_launch(table)
    pieces_dev = cp.asarray(pieces)
    k = kernels.compiled(cp)
    args = k.copy_args(int(dst.data.ptr), int(src.ctypes.data), int(pieces_dev.data.ptr), plan)
    fn, stream = k.fn["nl_copy"], cp.cuda.Stream(non_blocking=True)
    grid, block = (plan.blocks,), (plan.threads,)
    with stream:
        times = [timing.end_to_end(lambda: fn(grid, block, args), stream) for _ in range(reps)]
    bad = kernels.fragments_match(cp.asnumpy(dst), src, table)
    if bad is not None:
        raise RuntimeError(f"the bare launch moved wrong bytes (fragment {bad})")
    overhead = timing.host_clock_overhead_ns()
    return max(float(np.median(times[reps // 10:])) - overhead, 0.0), times


def lone_memcpy_ns(nbytes: int, reps: int = 100) -> tuple[float, list[float]]:
    """Device ns of events around one cudaMemcpyAsync pinned -> device, nothing before it on the
    stream (how issue 11 measured the 5.7 us reference; EventTimer.unqueued, raw like it):
    (median after a 10 % warm-up, every raw time)."""
    import cupy as cp

    from nearlocal.gpu import timing
    from nearlocal.gpu.methods import MEMCPY_HOST_TO_DEVICE

    src = cp.cuda.alloc_pinned_memory(nbytes)
    dst = cp.empty(nbytes, dtype=cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    timer = timing.EventTimer(cp, stream, None, 0)  # unqueued(): no blocking kernel

    def copy() -> None:
        cp.cuda.runtime.memcpyAsync(int(dst.data.ptr), src.ptr, nbytes, MEMCPY_HOST_TO_DEVICE,
                                    stream.ptr)

    times = [timer.unqueued(copy, stream) for _ in range(reps)]
    return float(np.median(times[reps // 10:])), times


def suite_verdicts(paths: list[str]) -> tuple[bool, list[str]]:
    lines, ok = [], True
    for path in paths:
        try:
            rows = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            lines.append(f"- {path}: unreadable ({exc})")
            ok = False
            continue
        bad = [r for r in rows if r["status"] not in ("ok", "skipped")]
        unexplained = [r for r in rows if r["status"] == "skipped" and not r.get("reason")]
        counts = {s: sum(r["status"] == s for r in rows) for s in sorted({r["status"] for r in rows})}
        lines.append(f"- {Path(path).name}: {counts}" + "".join(
            f"\n  - {r['case_id']}: {r['status']}: {r.get('reason')}" for r in bad + unexplained))
        ok = ok and not bad and not unexplained
    return ok, lines


def suites_only(out: Path, paths: list[str]) -> int:
    ok, suite_lines = suite_verdicts(paths)
    text = "\n".join(["", "## Suites: every case ok or skipped with a reason", "", *suite_lines,
                      "", f"- {'PASS' if ok else 'FAIL'} suites_ok_or_skipped"]) + "\n"
    with (out / "report.md").open("a") as report:
        report.write(text)
    path = out / "gpu_check.json"
    data = json.loads(path.read_text()) if path.exists() else {"checks": {}}
    data.setdefault("checks", {})["suites_ok_or_skipped"] = {"ok": ok, "text": suite_lines}
    path.write_text(json.dumps(data, indent=1, default=str))
    print(text)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/out")
    parser.add_argument("--suite-json", action="append", default=[],
                        help="a suite's JSON results (with --suites-only)")
    parser.add_argument("--suites-only", action="store_true",
                        help="only the suite verdict, appended to report.md and gpu_check.json")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.suites_only:
        return suites_only(out, args.suite_json)
    if args.suite_json:
        parser.error("--suite-json goes with --suites-only (the suites run after this check)")
    report: dict = {"table": {}, "checks": {}}
    lines = ["# nearlocal GPU check", "", "## Side by side: pinned <-> gpu:0 (median, GB/s)", "",
             "| method | access | timing | " + " | ".join(PATTERNS) + " |",
             "|---|---|---|" + "---|" * len(PATTERNS)]
    rows: dict = {}
    for method, access, timing in METHODS:
        cells = []
        for pattern in PATTERNS:
            row = _row(method, pattern, access, timing=timing)
            rows[(method, access, timing, pattern)] = row
            report["table"][row["case"]] = row
            cells.append(_cell(row))
        lines.append(f"| {method} | {access} | {timing} | " + " | ".join(cells) + " |")
    lines += ["", "What each interval contains:", ""]
    seen = set()
    for (method, _, timing, _), row in rows.items():
        for key in CONTAINS:
            text = row.get("info", {}).get(key)
            if text and (method, timing, text) not in seen:
                seen.add((method, timing, text))
                lines.append(f"- {method} ({timing}): {text}")
    failures = [r["case"] + ": " + r["error"] for r in rows.values() if "error" in r]
    lines += [f"- FAILED {f}" for f in failures]

    checks: dict[str, tuple[bool, str]] = {}
    memcpy = {p: rows[("cuda-memcpy-async", "read", "device", p)] for p in PATTERNS}
    gather = {p: rows[("gather-kernel", "read", "device", p)] for p in PATTERNS}
    torch_ns = torch_pinned_copy_ns(BIG)
    if torch_ns is None or "error" in memcpy["64MiB"]:
        checks["h2d_64MiB_vs_torch"] = (False, "torch unusable or the row failed")
    else:
        ratio = memcpy["64MiB"]["median_ns"] / torch_ns
        checks["h2d_64MiB_vs_torch"] = (abs(ratio - 1) <= 0.05, (
            f"cuda-memcpy-async {format_ns(memcpy['64MiB']['median_ns'])} vs torch copy_ "
            f"{format_ns(torch_ns)}: ratio {ratio:.3f} (must be within 5 %)"))
    if "error" in gather["64MiB"] or "error" in memcpy["64MiB"]:
        checks["gather_64MiB_bandwidth"] = (False, "a row failed")
    else:
        share = gather["64MiB"]["gbps"] / memcpy["64MiB"]["gbps"]
        checks["gather_64MiB_bandwidth"] = (share >= 0.85, (
            f"gather-kernel {gather['64MiB']['gbps']:.1f} GB/s vs cuda-memcpy-async "
            f"{memcpy['64MiB']['gbps']:.1f} GB/s: {share:.2f}x (must be >= 0.85x)"))
    if "error" in gather["64KiB"] or "error" in memcpy["64KiB"]:
        checks["gather_64KiB_time"] = (False, "a row failed")
    else:
        factor = gather["64KiB"]["median_ns"] / memcpy["64KiB"]["median_ns"]
        checks["gather_64KiB_time"] = (factor <= 1.5, (
            f"gather-kernel {format_ns(gather['64KiB']['median_ns'])} vs cuda-memcpy-async "
            f"{format_ns(memcpy['64KiB']['median_ns'])}: {factor:.2f}x (must be <= 1.5x)"))
    e2e = rows[("gather-kernel", "read", "e2e", "1024x160B")]
    try:
        bare, bare_times = bare_launch_ns("1024x160B")
        report["bare_launch_sync_1024x160B_ns"] = bare
        report["bare_launch_sync_1024x160B_raw_ns"] = bare_times
        if "error" in e2e:
            checks["gather_e2e_vs_bare_launch"] = (False, "the e2e row failed")
        else:
            factor = e2e["median_ns"] / bare
            checks["gather_e2e_vs_bare_launch"] = (factor <= 1.5, (
                f"gather-kernel e2e {format_ns(e2e['median_ns'])} vs bare RawKernel launch + "
                f"sync {format_ns(bare)}: {factor:.2f}x (must be <= 1.5x)"))
    except Exception as exc:
        checks["gather_e2e_vs_bare_launch"] = (False, f"bare launch failed: {exc}")
    lines += ["", "## What must hold", ""]
    for name, (ok, text) in checks.items():
        lines.append(f"- {'PASS' if ok else 'FAIL'} {name}: {text}")
    report["checks"] = {k: {"ok": ok, "text": text} for k, (ok, text) in checks.items()}

    unprimed = _row("cuda-memcpy-async", "64KiB", prime="0")
    try:
        lone, lone_times = lone_memcpy_ns(64 * 1024)
    except Exception as exc:  # shown in the report, not hidden
        lone, lone_times = float("nan"), []
        lines.append(f"(lone cudaMemcpyAsync failed: {exc})")
    report["64KiB"] = {"primed": memcpy["64KiB"], "unprimed": unprimed, "lone_events_ns": lone,
                       "lone_events_raw_ns": lone_times}
    lines += ["", "## 64 KiB pinned -> gpu:0, cuda-memcpy-async, device time (B11)", "",
              f"- behind the blocking kernel, primed (the row): {_cell(memcpy['64KiB'])}",
              f"- behind the blocking kernel, prime=0: {_cell(unprimed)}",
              f"- lone cudaMemcpyAsync between two events: {format_ns(lone)}"]

    lines += ["", "## gather-kernel 64 MiB by block size (for tuning; the verdict uses the default)",
              ""]
    for threads in ("256", "512"):
        row = _row("gather-kernel", "64MiB", threads=threads)
        report[f"gather_64MiB_threads_{threads}"] = row
        lines.append(f"- threads={threads}: {_cell(row)}")

    text = "\n".join(lines) + "\n"
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.md").write_text(text)
    print(text)
    return 0 if all(ok for ok, _ in checks.values()) and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
