"""Dependent-load latency: a pointer chase over a randomly permuted ring of cache lines.

Every 64-byte line of the region holds, in its first 8 bytes, the word index of the next line of
the ring. The ring is ONE cycle through every line (a uniformly random order of the lines, each
pointing at the next and the last at the first: a uniformly random cyclic permutation), so a walk
of `lines` hops touches each line exactly once and no short cycle keeps the walk inside the
cache. Each load's address is the value of the previous load: the loads cannot overlap, and the
time per hop is the load-to-use latency of wherever the line lives (L1, L2, LLC or memory, chosen
by the region's size), TLB misses included unless huge pages are used.

The timed interval of one sample is `hops` dependent loads, bracketed by fenced rdtscp; the
position is carried from one sample to the next, so consecutive samples walk on along the ring.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from nearlocal.kernels.intrinsics import tsc_begin, tsc_end

LINE = 64
WORDS_PER_LINE = LINE // 8


BUCKET_LINES = 1 << 15  # a bucket's indices (256 KiB) fit the L2 cache while it is shuffled


@njit(cache=True, inline="always")
def _splitmix64(state: np.ndarray) -> np.uint64:
    """The next 64 random bits of the generator whose state is state[0] (SplitMix64)."""
    state[0] += np.uint64(0x9E3779B97F4A7C15)
    z = state[0]
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True, inline="always")
def _below(state: np.ndarray, bound: int) -> int:
    """A uniform integer in [0, bound), bound < 2**32 (Lemire's multiply-shift with rejection:
    exact, one multiply per draw)."""
    b = np.uint64(bound)
    m = (_splitmix64(state) >> np.uint64(32)) * b
    if (m & np.uint64(0xFFFFFFFF)) < b:
        floor = (np.uint64(1 << 32) - b) % b
        while (m & np.uint64(0xFFFFFFFF)) < floor:
            m = (_splitmix64(state) >> np.uint64(32)) * b
    return int(m >> np.uint64(32))


def random_order(n: int, seed: int) -> np.ndarray:
    """A uniformly random permutation of 0..n-1 (see _shuffled_order), in the narrowest integer
    type that holds n: the scratch of a 1 GiB ring is 96 MiB instead of 192 MiB, which in a fresh
    process on a VM is ~0.7 s of page faults less."""
    order = np.empty(n, np.uint32 if n < 1 << 32 else np.int64)
    buckets = max(1, n // BUCKET_LINES)
    bucket_of = np.empty(n, np.uint16 if buckets <= 1 << 16 else np.int32)
    _shuffled_order(order, bucket_of, buckets, seed)
    return order


@njit(cache=True)
def _shuffled_order(order: np.ndarray, bucket_of: np.ndarray, buckets: int, seed: int) -> None:
    """A uniformly random permutation of 0..n-1 by Rao-Sandelius bucket shuffling: each index
    goes to a uniformly drawn bucket (in order), then each bucket is Fisher-Yates shuffled in
    place. Uniform, as one Fisher-Yates over all n would be, but each swap stays in a bucket the
    cache holds: a 1 GiB ring's 16.7 million lines in ~0.3 s instead of ~2 s of cache misses."""
    n = order.size
    state = np.full(1, np.uint64(seed) * np.uint64(0x2545F4914F6CDD1D) + np.uint64(1))
    starts = np.zeros(buckets + 1, np.int64)
    for i in range(n):
        b = _below(state, buckets)
        bucket_of[i] = b
        starts[b + 1] += 1
    for b in range(buckets):
        starts[b + 1] += starts[b]
    fill = starts[:-1].copy()
    for i in range(n):
        b = bucket_of[i]
        order[fill[b]] = i
        fill[b] += 1
    for b in range(buckets):
        low = starts[b]
        for i in range(starts[b + 1] - 1, low, -1):
            j = low + _below(state, i - low + 1)
            order[i], order[j] = order[j], order[i]


@njit(cache=True)
def write_ring(words: np.ndarray, order: np.ndarray) -> None:
    """The first word of line order[k] = word index of line order[k + 1] (the last: order[0])."""
    n = order.size
    for k in range(n):
        words[order[k] * WORDS_PER_LINE] = np.uint64(order[(k + 1) % n] * WORDS_PER_LINE)


def build_ring(words: np.ndarray, lines: int, seed: int = 1) -> None:
    """Lay a one-cycle random ring over the first `lines` lines of `words` (a uint64 view of the
    region)."""
    if lines < 1 or lines * WORDS_PER_LINE > words.size:
        raise ValueError(f"a ring of {lines} lines does not fit {words.size * 8} bytes")
    write_ring(words, random_order(lines, seed))


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
