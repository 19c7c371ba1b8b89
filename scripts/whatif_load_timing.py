"""Times the serving simulation (docs/whatif.md "Serving under load") over a whole trace and
every serving path: the trace read, its prefix store, the simulation and the capacity search.
Every hop is filled from the shipped reference boxes (no run needed), so all paths are complete
and the figure is the simulation's, not a store's read. Quote it with the box and how busy it
was; the issue's bound is 10 s on 2 cores for Mooncake's conversation trace.

    python3 scripts/whatif_load_timing.py nearlocal/data/traces/mooncake-conversation.jsonl
    python3 scripts/whatif_load_timing.py TRACE --link-sharing ps --links 4 --gpus-per-link 2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nearlocal.whatif import reference_box
from nearlocal.whatif.load import Setup, serve, trace_workload
from nearlocal.whatif.serving import WhatifInputs
from nearlocal.whatif.traffic import prefix_hits, read_trace

REFERENCES = ("beluga-h20", "swiftcache-media", "h100-sxm")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--link-sharing", default="fifo")
    parser.add_argument("--links", type=int, default=1)
    parser.add_argument("--gpus-per-link", type=int, default=1)
    parser.add_argument("--prefill-tokens-per-s", type=float, default=40000.0)
    parser.add_argument("--ttft-target", type=float, default=2.0, help="seconds")
    args = parser.parse_args()
    measured: dict = {}
    for name in REFERENCES:
        for hop, models in reference_box(name).links.items():
            measured.setdefault(hop, list(models))
    start = time.perf_counter()
    trace = read_trace(args.trace)
    work = trace_workload(trace, prefix_hits(trace))
    read = time.perf_counter()
    result = serve(WhatifInputs(measured, "references " + ", ".join(REFERENCES)), work,
                   Setup(args.links, args.gpus_per_link, args.link_sharing,
                         args.prefill_tokens_per_s, args.ttft_target))
    done = time.perf_counter()
    complete = sum(p.complete for p in result.paths)
    print(f"{len(trace)} requests, {complete} of {len(result.paths)} paths complete: trace and "
          f"store {read - start:.2f} s, simulation and capacity {done - read:.2f} s, "
          f"{done - start:.2f} s in all")
    for path in result.paths:
        print(f"  {path.path}: P99 TTFT {path.ttft.p99:.3f} s, capacity {path.capacity}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
