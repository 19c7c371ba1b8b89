"""Prints how long `nearlocal --version`, `--help` and `probe` take to start on this box, and which
heavy libraries each imported (issue 19: --help and --version <= 0.3 s, probe <= 1 s).

    python scripts/startup_times.py [--repeat 5]

Each command runs in a fresh interpreter (`python -m nearlocal`, what the `nearlocal` script
runs); the figure is the median wall time over the repeats. Say the box's load with the figures:
this script prints it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

COMMANDS = (["--version"], ["--help"], ["probe"])
HEAVY = ("numba", "scipy", "pandas", "matplotlib", "pyarrow", "numpy")
# Run the command, then name the heavy libraries it left in sys.modules (on stderr).
CHILD = ("import sys, runpy\n"
         "sys.argv = ['nearlocal', *sys.argv[1:]]\n"
         "try:\n"
         "    runpy.run_module('nearlocal.frontends.cli', run_name='__main__')\n"
         "except SystemExit:\n"
         "    pass\n"
         f"print('heavy:', ','.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f}, {os.cpu_count()} CPUs")
    for command in COMMANDS:
        times, heavy = [], ""
        for _ in range(args.repeat):
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", CHILD, *command], capture_output=True,
                                  text=True, check=False)
            times.append(time.perf_counter() - start)
            heavy = next((line[len("heavy: "):] for line in done.stderr.splitlines()
                          if line.startswith("heavy: ")), "?")
        print(f"nearlocal {' '.join(command):10s} median {statistics.median(times):.2f} s "
              f"(min {min(times):.2f}, max {max(times):.2f}, {args.repeat} runs); "
              f"imported: {heavy or 'none of ' + ', '.join(HEAVY)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
