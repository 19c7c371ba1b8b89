"""nearlocal's own load kernel (time_load, back to back) over three 1 GB buffers of one process,
read in turn: its dram region (MAP_POPULATE and its fill), a buffer faulted page by page with a
memset (likwid's first touch) and one mapped with MAP_POPULATE, in the order given. What
docs/timing.md's "load (and store) against likwid" quotes: on a VM which pages a buffer gets
moves one thread's load bandwidth more than the tool or the loop does.

    python scripts/load_buffers.py [region-first|region-last]
"""

from __future__ import annotations

import mmap
import sys

import numpy as np

from nearlocal.kernels.cpu import time_load
from nearlocal.probe import probe
from nearlocal.regions import parse_region, region_kind

BYTES = 10**9
ROUNDS, PASSES = 5, 3


def anonymous(populate: bool) -> np.ndarray:
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (mmap.MAP_POPULATE if populate else 0)
    buf = np.frombuffer(mmap.mmap(-1, BYTES, flags=flags), np.uint8)
    buf[:] = 1  # faults it page by page where it was not populated
    return buf


def main(order: str) -> None:
    hz = probe(gpu=False).tsc_hz
    spec = parse_region("dram")
    buffers, region = {}, None
    makers = [("memset first touch", lambda: anonymous(False)),
              ("MAP_POPULATE + memset", lambda: anonymous(True))]
    if order == "region-first":
        region = region_kind(spec).open(spec, BYTES, "wb", False)
        buffers["nearlocal dram region"] = region.array[:BYTES]
    for name, make in makers:
        buffers[name] = make()
    if region is None:
        region = region_kind(spec).open(spec, BYTES, "wb", False)
        buffers["nearlocal dram region"] = region.array[:BYTES]
    frags, dst, sink = np.array([[0, 0, BYTES]], np.int64), np.zeros(64, np.uint8), np.zeros(1, np.uint64)
    ticks = {name: [] for name in buffers}
    for _ in range(ROUNDS):
        for name, buf in buffers.items():
            samples = np.zeros(PASSES, np.int64)
            time_load(buf, dst, frags, samples, sink, False, 1)  # drain off: back to back
            ticks[name] += samples.tolist()
    print(f"buffers mapped {order.replace('-', ' ')}:")
    for name, passes in ticks.items():
        print(f"  {name:24s} {BYTES / (np.median(passes) / hz) / 1e9:6.2f} GB/s "
              f"(median of {len(passes)} passes)")
    region.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "region-first")
