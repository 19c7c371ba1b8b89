#!/usr/bin/env python3
"""Does a batched sample (N passes drained by an mfence between them) give the figure of one
isolated pass? The check behind `batch_with_drain` (cpu/methods.py, docs/timing.md).

    python3 scripts/batch_check.py [--sizes 16KiB,64KiB] [--passes 8] [--samples 4001]

For each CPU method with `passes` (drain=before), at each size: the mean ns per pass of
samples of one pass and of samples of N passes (the mfences' idle cost subtracted as the
session does), in one process, alternating. Means, not medians: a coarse clock quantises each
sample but its jitter dithers the mean. Pick sizes whose one pass spans tens of clock steps.
A method may batch only where the ratio stays within a few percent on every size.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16KiB,64KiB")
    parser.add_argument("--passes", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4001)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    from nearlocal.core.cases import Case
    from nearlocal.core.methods import load_methods
    from nearlocal.cpu.methods import CPU_KERNELS
    from nearlocal.engine.worker import open_case
    from nearlocal.kernels import cpu
    from nearlocal.kernels.timer import measure_clock
    from nearlocal.probe import probe

    load_methods()
    inventory = probe(gpu=False)
    clock = measure_clock()
    hz = inventory.tsc_hz
    methods = ["load", "store", "nt-store", "memcpy", "clflush-load", "store-clwb"]
    print(f"clock step {clock.step_ns(hz):.2f} ns, overhead {clock.overhead_ticks:g} ticks; "
          f"{args.passes} passes vs 1, mean ns per pass")
    print(f"{'method':<14} {'size':>7} {'1 pass':>9} {f'{args.passes} passes':>10} {'ratio':>7}")
    for method in methods:
        flag = {"clflush-load": "clflush", "store-clwb": "clwb"}.get(method)
        if flag and not inventory.cpu.has(flag):
            print(f"{method:<14} skipped: CPU lacks {flag}")
            continue
        kernel = CPU_KERNELS[method].timed()  # the kernel the method declares
        for size in args.sizes.split(","):
            with open_case(Case(method, "dram", "wb", size), hz, clock.overhead_ticks, False,
                           inventory, clock.quantum_ticks) as opened:
                ctx = opened.session.ctx
                sink = np.zeros(1, np.uint64)
                drains = np.empty(args.samples, np.uint64)
                cpu.time_drains(drains, args.passes)
                drain = max(float(np.median(drains)) - clock.overhead_ticks, 0.0)
                single, batched = [], []
                for _ in range(args.rounds):
                    for passes, into, extra in ((1, single, 0.0), (args.passes, batched, drain)):
                        ticks = np.empty(args.samples, np.uint64)
                        kernel(ctx.src.array, ctx.dst.array, ctx.pattern.frags, ticks, sink,
                               True, passes)
                        body = ticks.astype(np.float64) - clock.overhead_ticks - extra
                        into.append(float(np.mean(body)) * 1e9 / hz / passes)
                one, many = float(np.median(single)), float(np.median(batched))
                print(f"{method:<14} {size:>7} {one:>9.1f} {many:>10.1f} {many / one:>6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
