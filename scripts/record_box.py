#!/usr/bin/env python3
"""Record this box's clock trace for tests/fixtures/boxes (docs/timing.md, "Recorded boxes").

    python3 scripts/record_box.py tests/fixtures/boxes/NAME.npz

Writes, with numpy.savez_compressed:
- empty_interval_ticks: uint64 (32, 20000): 32 runs of kernels.cpu.timer_overhead (an empty
  fenced rdtscp interval) in one process, 50 ms apart: the readings a run's clock is read from,
  interrupts and VM exits included;
- tsc_hz: float64, calibrated against CLOCK_MONOTONIC_RAW;
- chase_spans / chase_ns_per_hop: a pointer chase's ns per hop over rings of growing span (the
  curve the usable last-level cache is read from, probe.cache);
- facts: JSON text: CPU model, flags, cpuid's and sysfs' cache sizes, kernel, when.
It prints the step and overhead nearlocal finds in each run. Add the file with a line in
tests/fixtures/boxes/README.md saying what the box is and what its TSC really does (the step you
read from the values themselves); tests/test_clock.py loads every file there.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

RUNS, REPS, GAP_S = 32, 20000, 0.05


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].endswith(".npz"):
        print("usage: record_box.py OUT.npz", file=sys.stderr)
        return 2
    out = Path(argv[0])
    if not out.parent.is_dir():
        print(f"record_box.py: directory {out.parent} does not exist", file=sys.stderr)
        return 2
    from nearlocal.kernels.timer import calibrate, calibrate_tsc_hz, empty_intervals
    from nearlocal.probe import probe
    from nearlocal.probe.cache import chase_curve

    empty_intervals(16)  # compile / load the timer kernel
    runs = np.zeros((RUNS, REPS), np.uint64)
    for index in range(RUNS):
        runs[index] = empty_intervals(REPS)
        time.sleep(GAP_S)
    tsc_hz = calibrate_tsc_hz()
    inventory = probe(gpu=False)
    spans, ns = chase_curve(inventory.cpu.l2_bytes, inventory.cpu.cpuid_llc_bytes, tsc_hz)
    facts = {"model": inventory.cpu.model, "flags": sorted(inventory.cpu.flags),
             "l2_bytes": inventory.cpu.l2_bytes, "cpuid_llc_bytes": inventory.cpu.cpuid_llc_bytes,
             "llc_bytes": inventory.cpu.llc_bytes, "llc_source": inventory.cpu.llc_source,
             "kernel": platform.release(), "recorded": time.strftime("%Y-%m-%d")}
    np.savez_compressed(out, empty_interval_ticks=runs, tsc_hz=np.float64(tsc_hz),
                        chase_spans=np.asarray(spans, np.int64),
                        chase_ns_per_hop=np.asarray(ns, np.float64), facts=json.dumps(facts))
    for index, run in enumerate(runs):
        clock = calibrate(run)
        print(f"run {index:2d}: step {clock.quantum_ticks:g} ticks ({clock.evidence['how']}), "
              f"overhead {clock.overhead_ticks:g} ticks, max {int(run.max())}")
    print(f"tsc_hz {tsc_hz:.6g}; chase ns/hop by span: "
          + ", ".join(f"{s >> 10} KiB {v:.1f}" for s, v in zip(spans, ns, strict=True)))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
