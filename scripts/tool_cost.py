"""What nearlocal itself costs beside what it measures (issue 37's targets), on this box:

  the default quick run        wall <= 1.5 x (its measured cases' budgets + the kernels' compile)
  run --method load --size 1GiB --threads 2     wall < 30 s
  run --suite rpc                               wall < 60 s
  the unit suite (--unit)                       wall < 6 min on 2 cores

    python3 scripts/tool_cost.py [--unit] [--keep DIR]

Each run goes to a fresh store; its wall time is the command's, from start to exit. The budget
sum is the budget of every case the run measured (skipped cases cost none); the compile is the
run's own "kernels ready" line (start-up, probe, the clock's calibration and numba's compile or
cache load, up to the first measurement). Quote figures from a quiet box: the load average is
printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = (  # (name, extra run arguments, limit in seconds or None for the ratio target)
    ("default quick run", [], None),
    ("load 1GiB --threads 2", ["--method", "load", "--size", "1GiB", "--threads", "2"], 30.0),
    ("--suite rpc", ["--suite", "rpc"], 60.0),
)
QUICK_RATIO = 1.5
UNIT = ["-q", "-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider"]  # as scripts/test.sh


def seconds(text: str) -> float:
    """The progress line's duration back to seconds: '12 s', '1m05s', '2h03m'."""
    total = 0.0
    for value, unit in re.findall(r"(\d+)\s*(h|m|s)", text):
        total += float(value) * {"h": 3600, "m": 60, "s": 1}[unit]
    return total


def nearlocal(args: list[str]) -> tuple[float, str, int]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}".rstrip(":")}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "nearlocal", *args], env=env, text=True,
                          capture_output=True)
    return time.perf_counter() - start, done.stdout + done.stderr, done.returncode


def measured_budget(store: Path) -> tuple[int, float]:
    """(cases measured, the sum of their budgets) of the one run in `store`."""
    import pandas as pd

    run = next(p for p in store.iterdir() if (p / "run.json").exists())
    meta = json.loads((run / "run.json").read_text())
    cases = pd.read_parquet(run / "cases.parquet", columns=["status"])
    measured = int((cases["status"] == "ok").sum())
    return measured, measured * float(meta["settings"]["budget_s"])


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unit", action="store_true", help="also time the unit suite")
    parser.add_argument("--keep", type=Path, help="keep the stores under this folder")
    args = parser.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="nearlocal-cost."))
    print(f"load average {load_average()}, {os.cpu_count()} CPUs, stores under {base}")
    passed = True
    for index, (name, extra, limit) in enumerate(RUNS):
        store = base / f"run{index}"
        wall, log, code = nearlocal(["run", "--out", str(store), *extra])
        if code != 0:
            print(f"{name}: exit {code}\n{log[-2000:]}")
            passed = False
            continue
        ready = re.search(r"^(.*?): kernels ready", log, re.M)
        compile_s = seconds(ready.group(1)) if ready else 0.0
        cases, budget = measured_budget(store)
        if limit is None:
            ratio = wall / max(budget + compile_s, 1e-9)
            ok = ratio <= QUICK_RATIO
            verdict = (f"{ratio:.2f}x of (budgets {budget:.1f} s + kernels ready {compile_s:.1f} s)"
                       f", target <= {QUICK_RATIO}x")
        else:
            ok = wall < limit
            verdict = f"target < {limit:.0f} s (budgets {budget:.1f} s, kernels ready {compile_s:.1f} s)"
        passed &= ok
        print(f"{name}: {wall:.1f} s for {cases} measured cases; {verdict}: "
              f"{'ok' if ok else 'MISSED'}")
    if args.unit:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pytest", *UNIT], cwd=ROOT, text=True,
                              capture_output=True)
        wall = time.perf_counter() - start
        tail = (done.stdout.strip().splitlines() or [""])[-1]
        ok = done.returncode == 0 and wall < 360
        passed &= ok
        print(f"unit suite: {wall / 60:.1f} min ({tail}); target < 6 min: "
              f"{'ok' if ok else 'MISSED'}")
    print(f"load average {load_average()}; tool cost: {'ok' if passed else 'MISSED'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
