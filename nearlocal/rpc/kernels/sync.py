"""Ordered 64-bit words in shared memory, and the two visibility protocols built on them.

`coherent`: release stores and acquire loads are enough (one cache-coherent host).
`flush`: what a non-coherent pool (CXL 2.0 shared between hosts) needs: the writer's data leaves
its cache (nontemporal stores, sfence) before the flag flips, and the reader invalidates its copy
(clflushopt, mfence) before every load of shared data. The rule holds for every shared word: one
written with cached stores (an area initialised in place) is flushed (`flush_written`) before
anyone may read it, and one read is invalidated first, even a word this agent owns if another
agent (a previous owner) may have written it last.

Words are addressed as indices into a uint64 view of the region; the same memory as a uint8 view
is passed for the cache-line instructions (the range intrinsics take bytes). The ordered loads and
stores themselves are intrinsics (kernels/intrinsics.py).
"""

from __future__ import annotations

from numba import njit

from nearlocal.kernels.intrinsics import (
    clflushopt_range,
    load_acquire,
    mfence,
    nt_store_word,
    sfence,
    store_release,
)
from nearlocal.rpc.protocols import FLUSH

LINE = 64
WORDS_PER_LINE = LINE // 8


@njit(cache=True, nogil=True)
def invalidate(raw, words, first, count, protocol):
    """Before reading words [first, first+count) another agent wrote: drop our cached copy."""
    if protocol == FLUSH:
        clflushopt_range(raw, first * 8, count * 8)
        mfence()


@njit(cache=True, nogil=True)
def flush_written(raw, first, count, protocol):
    """After cached stores to words [first, first+count) (an area set up in place): write the
    lines back to memory before another agent may read them (no-op under `coherent`)."""
    if protocol == FLUSH:
        clflushopt_range(raw, first * 8, count * 8)
        sfence()


@njit(cache=True, nogil=True)
def read_flag(raw, words, index, protocol):
    """A flag another agent flips: invalidated first under `flush`, then an acquire load."""
    if protocol == FLUSH:
        clflushopt_range(raw, index * 8, 8)
        mfence()
    return load_acquire(words, index)


@njit(cache=True, nogil=True)
def write_data(words, index, value, protocol):
    """One word of data another agent will read once a flag says so."""
    if protocol == FLUSH:
        nt_store_word(words, index, value)
    else:
        words[index] = value


@njit(cache=True, nogil=True)
def publish_flag(words, index, value, protocol):
    """Make earlier data writes visible, then flip the flag (and push the flag out under flush)."""
    if protocol == FLUSH:
        sfence()  # nontemporal data stores are globally visible before the flag
        nt_store_word(words, index, value)
        sfence()
    else:
        store_release(words, index, value)


# The ready and stop checks of the flag waits (kernels/spin.py's spin_until), args in one tuple.


@njit(cache=True, nogil=True, inline="always")
def flag_is(args):
    """Ready when the flag at `index` holds `want`: args (raw, words, index, protocol, want)."""
    raw, words, index, protocol, want = args
    value = read_flag(raw, words, index, protocol)
    return value == want, value


@njit(cache=True, nogil=True, inline="always")
def flag_moved(args):
    """Ready when the flag at `index` no longer holds `old` (the value it holds then):
    args (raw, words, index, protocol, old)."""
    raw, words, index, protocol, old = args
    value = read_flag(raw, words, index, protocol)
    return value != old, value


@njit(cache=True, nogil=True, inline="always")
def flag_set(args):
    """A stop check: the word at `index` is set. args (raw, words, index, protocol)."""
    raw, words, index, protocol = args
    return read_flag(raw, words, index, protocol) != 0
