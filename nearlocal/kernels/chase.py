"""Dependent-load latency: a pointer chase over a randomly permuted ring of cache lines.

Every 64-byte line of the region holds, in its first 8 bytes, the word index of the next line of
the ring. The ring is ONE cycle through every line (Sattolo's algorithm draws a uniformly random
cyclic permutation), so a walk of `lines` hops touches each line exactly once and no short cycle
keeps the walk inside the cache. Each load's address is the value of the previous load: the loads
cannot overlap, and the time per hop is the load-to-use latency of wherever the line lives (L1,
L2, LLC or memory, chosen by the region's size), TLB misses included unless huge pages are used.

The timed interval of one sample is `hops` dependent loads, bracketed by fenced rdtscp; the
position is carried from one sample to the next, so consecutive samples walk on along the ring.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from nearlocal.kernels.intrinsics import tsc_begin, tsc_end

LINE = 64
WORDS_PER_LINE = LINE // 8


@njit(cache=True)
def sattolo_cycle(n: int, seed: int) -> np.ndarray:
    """succ[i] = the line after line i; one cycle over all n lines (Sattolo, 1986)."""
    np.random.seed(seed)
    order = np.arange(n)
    for i in range(n - 1, 0, -1):
        j = np.random.randint(0, i)  # j < i: never a fixed point, so one single cycle
        order[i], order[j] = order[j], order[i]
    succ = np.empty(n, np.int64)
    for k in range(n):  # the cycle visits order[0], order[1], ... order[n-1], order[0]
        succ[order[k]] = order[(k + 1) % n] if n > 1 else order[k]
    return succ


@njit(cache=True)
def write_ring(words: np.ndarray, succ: np.ndarray) -> None:
    """Line i's first word = word index of line succ[i]."""
    for i in range(succ.size):
        words[i * WORDS_PER_LINE] = np.uint64(succ[i] * WORDS_PER_LINE)


def build_ring(words: np.ndarray, lines: int, seed: int = 1) -> np.ndarray:
    """Lay a one-cycle ring over the first `lines` lines of `words` (a uint64 view of the region);
    returns the successor table (for tests)."""
    if lines < 1 or lines * WORDS_PER_LINE > words.size:
        raise ValueError(f"a ring of {lines} lines does not fit {words.size * 8} bytes")
    succ = sattolo_cycle(lines, seed)
    write_ring(words, succ)
    return succ


@njit(cache=True, nogil=True)
def walk(words, start, hops):
    """Untimed walk (warm-up, tests): the word index reached after `hops` hops."""
    p = np.uint64(start)
    for _ in range(hops):
        p = words[p]
    return p


@njit(cache=True, nogil=True)
def time_chase(words, hops, samples, position):
    """Each sample: `hops` dependent loads between fenced rdtscp reads. position[0] carries the
    current word index between calls (and keeps the walk's result live)."""
    p = np.uint64(position[0])
    for r in range(samples.size):
        t0 = tsc_begin()
        for _ in range(hops):
            p = words[p]
        t1 = tsc_end()
        samples[r] = t1 - t0
    position[0] = p
