"""Does the CI gate hold on this box? Measures both modes (docs/ci.md) and prints a summary.

Code CI (`compare --mode code`, the runs taking turns: paired). Four runs of the `gate` suite
(tests/gate_plugin.py: gate-load / gate-chase, their unchanged twins, a few others) take turns
pass by pass (`run --take-turns --for-gate code`): three of unchanged code, one with a REAL 1.3x
slowdown of the gate cases (NEARLOCAL_GATE_SLOWDOWN: their kernels do 1.3x the work).
  unchanged pairs (3): >= 85 % of compared cases `same`, no case `slower`;
  unchanged -> slowed pairs (3): >= 90 % of the gate cases `slower`, gate-chase 1 GiB in each.
Box CI (`compare --mode box`). Four unchanged runs one after another (`run --for-gate box`),
then a fifth while a memory-bandwidth hog streams a buffer on another CPU (the runs pinned to
one CPU, the hog to another, started for the fifth run only and killed after; the hog is a few
lines of C copying 2 x GATE_HOG_MIB with non-temporal stores, numpy's copy where no C compiler):
  back-to-back pairs (3): no case `slower` unless a host probe that is its yardstick moved
  beyond the threshold, and then the report's first line names that layer;
  the fourth run -> the hogged one: exit 1, the memory probe named first, `chase` 1 GiB and
  >= 90 % of the memory-bound cases (memory among their yardsticks) `slower`.

  python3 scripts/gate_check.py [STORE]         (bash scripts/gate_check.sh does the same)
Settings by environment: GATE_CHECKS (code,box), GATE_SUITE (gate), GATE_RUN_ARGS (more
`nearlocal run` options, e.g. "--budget 0.05 --processes 4" for a quick try of the script),
GATE_REUSE=1 (judge the runs already in STORE), GATE_HOG_MIB (512), NEARLOCAL (the command).
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHASE_1GIB = "gate-chase/dram/wb/1GiB"
HOG_PY = """
import os, sys
import numpy as np
os.sched_setaffinity(0, {int(sys.argv[1])})
a = np.ones(int(sys.argv[2]) << 17)
b = np.empty_like(a)
while True:
    np.copyto(b, a)
"""
HOG_C = r"""
#include <emmintrin.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {  /* copy a -> b with streaming stores, swap, forever */
    size_t n = (size_t)atol(argv[1]) << 20;
    char *a = aligned_alloc(64, n), *b = aligned_alloc(64, n);
    memset(a, 1, n); memset(b, 2, n);
    for (;;) {
        for (size_t i = 0; i < n; i += 64) {
            __m128i *s = (__m128i *)(a + i), *d = (__m128i *)(b + i);
            __m128i x0 = _mm_load_si128(s), x1 = _mm_load_si128(s + 1);
            __m128i x2 = _mm_load_si128(s + 2), x3 = _mm_load_si128(s + 3);
            _mm_stream_si128(d, x0); _mm_stream_si128(d + 1, x1);
            _mm_stream_si128(d + 2, x2); _mm_stream_si128(d + 3, x3);
        }
        char *t = a; a = b; b = t;
    }
}
"""


def hog_command(store: Path, cpu: int) -> list[str]:
    """The C hog pinned to `cpu`, compiled into the store; numpy's copy where that fails."""
    mib = os.environ.get("GATE_HOG_MIB", "512")
    source, binary = store / "hog.c", store / "hog"
    source.write_text(HOG_C)
    built = subprocess.run(["cc", "-O2", "-msse2", "-o", str(binary), str(source)],
                           capture_output=True, text=True) if shutil.which("cc") else None
    if built is not None and built.returncode == 0:
        return ["taskset", "-c", str(cpu), str(binary), mib]
    print("gate check: no C compiler for the hog; numpy's copy instead (a weaker hog)")
    return [sys.executable, "-c", HOG_PY, str(cpu), mib]


def nearlocal() -> list[str]:
    if os.environ.get("NEARLOCAL"):
        return shlex.split(os.environ["NEARLOCAL"])
    return [sys.executable, "-c", "import sys; from nearlocal.frontends.cli import main; sys.exit(main())"]


def environment(slowdown: float) -> dict:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{ROOT}:{path}" if path else str(ROOT),
            "NEARLOCAL_PLUGINS": "tests.gate_plugin", "NEARLOCAL_GATE_SLOWDOWN": str(slowdown)}


def run_args(store: Path, mode: str) -> list[str]:
    return ["run", "--out", str(store), "--quiet", "--suite", os.environ.get("GATE_SUITE", "gate"),
            "--for-gate", mode, *shlex.split(os.environ.get("GATE_RUN_ARGS", ""))]


def stored(log: str) -> str:
    ids = [line.rsplit("/", 1)[-1] for line in log.splitlines() if line.startswith("stored ")]
    if not ids:
        sys.exit(f"a run stored nothing:\n{log}")
    return ids[-1].strip()


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def code_runs(store: Path) -> list[tuple[str, str]]:
    """Four arms taking turns: three unchanged, one slowed. [(kind, run id)]."""
    kinds = ["same", "same", "same", "slow"]
    started = time.time()
    procs = [subprocess.Popen([*nearlocal(), *run_args(store, "code"), "--take-turns",
                               str(store / "turns"), "--turn", f"{i}/{len(kinds)}"],
                              env=environment(1.3 if kind == "slow" else 1.0), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for i, kind in enumerate(kinds)]
    logs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit("a turn-taking run failed:\n" + "\n".join(logs))
    print(f"code CI: {len(kinds)} runs taking turns in {time.time() - started:.0f} s, "
          f"load average {load_average()}")
    return [(kind, stored(log)) for kind, log in zip(kinds, logs, strict=True)]


def one_run(store: Path, cpu: int | None) -> str:
    pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
    done = subprocess.run([*pin, *nearlocal(), *run_args(store, "box")], env=environment(1.0),
                          text=True, capture_output=True)
    if done.returncode:
        sys.exit(f"a box run failed:\n{done.stdout}{done.stderr}")
    return stored(done.stdout)


def box_runs(store: Path) -> list[tuple[str, str]]:
    """Four unchanged runs one after another, then one with a memory hog on another CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    run_cpu, hog_cpu = (cpus[0], cpus[-1]) if len(cpus) > 1 else (None, None)
    runs = []
    for kind in ("same", "same", "same", "same", "hog"):
        started, hog = time.time(), None
        if kind == "hog":
            hog = subprocess.Popen(hog_command(store, hog_cpu if hog_cpu is not None
                                               else cpus[0]))
        try:
            runs.append((kind, one_run(store, run_cpu)))
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
        print(f"box CI: run {runs[-1][1]} ({kind}) in {time.time() - started:.0f} s, "
              f"load average {load_average()}")
    return runs


def compare(store: Path, base: str, cand: str, mode: str) -> tuple[int, dict]:
    done = subprocess.run([*nearlocal(), "compare", base, cand, "--out", str(store), "--mode",
                           mode, "--format", "json"], env=environment(1.0), text=True,
                          capture_output=True)
    if done.returncode not in (0, 1):
        sys.exit(f"compare {base} {cand} failed: {done.stderr.strip()}")
    return done.returncode, json.loads(done.stdout)


def share_same(report: dict) -> tuple[int, int]:
    counts = report["counts"]
    return counts["same"], sum(counts[v] for v in ("slower", "faster", "ambiguous", "same"))


def check_code(store: Path, runs: list[tuple[str, str]]) -> list[tuple[str, str, bool]]:
    same = [run for kind, run in runs if kind == "same"]
    slow = [run for kind, run in runs if kind == "slow"]
    rows, shares, false = [], [], 0
    for i, base in enumerate(same):
        for cand in same[i + 1:]:
            code, report = compare(store, base, cand, "code")
            n_same, compared = share_same(report)
            shares.append(n_same / max(compared, 1))
            false += report["counts"]["slower"]
            print(f"  code {base} -> {cand}: exit {code}, {n_same}/{compared} same, "
                  f"{report['counts']['slower']} slower; {report['head']}")
    rows.append(("code: unchanged pairs, share same (>= 85 %)",
                 ", ".join(f"{s:.0%}" for s in shares), bool(shares) and min(shares) >= 0.85))
    rows.append(("code: unchanged pairs, false slower (0)", str(false), false == 0))
    caught = total = chased = 0
    for base in same:
        for cand in slow:
            code, report = compare(store, base, cand, "code")
            gate = [c for c in report["cases"] if c["case_id"].startswith("gate-")]
            hits = [c for c in gate if c["verdict"] == "slower"]
            caught, total = caught + len(hits), total + len(gate)
            chased += any(c["case_id"] == CHASE_1GIB and c["verdict"] == "slower" for c in gate)
            missed = ", ".join(f"{c['case_id']} {c['verdict']}" for c in gate if c not in hits)
            print(f"  code {base} -> {cand} (1.3x): exit {code}, {len(hits)}/{len(gate)} gate "
                  f"cases slower{'; missed ' + missed if missed else ''}")
    pairs = len(same) * len(slow)
    rows.append(("code: 1.3x slowdown caught (>= 90 %)", f"{caught}/{total}",
                 total > 0 and caught >= 0.9 * total))
    rows.append(("code: gate-chase 1 GiB caught in every pair", f"{chased}/{pairs}",
                 chased == pairs))
    return rows


def explained(report: dict) -> bool:
    """Every slower case has a yardstick whose layer moved beyond the threshold, named first."""
    moved = {p["probe"] for p in report["host_probes"] if p["beyond_threshold"]}
    named = all(p["layer"] in report["head"] for p in report["host_probes"]
                if p["beyond_threshold"])
    return named and all(set(c["detail"].get("yardsticks", [])) & moved
                         for c in report["cases"] if c["verdict"] == "slower")


def check_box(store: Path, runs: list[tuple[str, str]]) -> list[tuple[str, str, bool]]:
    same = [run for kind, run in runs if kind == "same"]
    hog = [run for kind, run in runs if kind == "hog"]
    unexplained = slower = 0
    for base, cand in itertools.pairwise(same):
        code, report = compare(store, base, cand, "box")
        slower += report["counts"]["slower"]
        unexplained += 0 if explained(report) else report["counts"]["slower"]
        print(f"  box {base} -> {cand}: exit {code}, {report['counts']['slower']} slower; "
              f"{report['head']}")
    rows = [("box: back-to-back pairs, slower cases without a moved layer (0)",
             f"{unexplained} (of {slower} slower)", unexplained == 0)]
    for cand in hog:
        code, report = compare(store, same[-1], cand, "box")
        memory = [c for c in report["cases"] if "memory" in c["detail"].get("yardsticks", [])]
        hits = [c for c in memory if c["verdict"] == "slower"]
        chase = next((c for c in report["cases"] if c["case_id"] == "chase/dram/wb/1GiB"), {})
        named = "memory" in report["moved_layers"] and "memory" in report["head"]
        print(f"  box {same[-1]} -> {cand} (memory hog): exit {code}; {report['head']}; "
              f"{len(hits)}/{len(memory)} memory-bound cases slower")
        rows.append(("box: memory hog, exit 1, memory named first, chase 1 GiB and >= 90 % "
                     "of memory-bound cases slower",
                     f"exit {code}, {'named' if named else 'NOT named'}, chase 1 GiB "
                     f"{chase.get('verdict', 'absent')}, {len(hits)}/{len(memory)} memory-bound "
                     "slower", code == 1 and named and chase.get("verdict") == "slower"
                     and len(hits) >= 0.9 * len(memory)))
    return rows


def main() -> int:
    store = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(
        prefix="nearlocal-gate."))
    store.mkdir(parents=True, exist_ok=True)
    checks = os.environ.get("GATE_CHECKS", "code,box").split(",")
    print(f"store {store}; load average {load_average()}; {os.cpu_count()} CPUs; "
          f"checks {', '.join(checks)}")
    listing = store / "gate-runs.json"
    reuse = os.environ.get("GATE_REUSE") == "1"
    runs = json.loads(listing.read_text()) if reuse else {}
    started = time.time()
    rows = []
    for check, make, judge in (("code", code_runs, check_code), ("box", box_runs, check_box)):
        if check not in checks:
            continue
        if not reuse:
            runs[check] = make(store)
            listing.write_text(json.dumps(runs))
        rows += judge(store, runs[check])
    print(f"\ngate check, {time.strftime('%Y-%m-%d %H:%M')}, {time.time() - started:.0f} s, "
          f"load average at the end {load_average()}")
    width = max(len(r[0]) for r in rows) if rows else 0
    for what, figure, ok in rows:
        print(f"  {what:<{width}}  {figure:<40}  {'pass' if ok else 'FAIL'}")
    passed = all(ok for _, _, ok in rows)
    print("gate check:", "PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
