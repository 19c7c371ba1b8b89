"""The timed kernels of the kv-metadata method (numba): imported when a session opens, so that
registering the method compiles nothing."""

from __future__ import annotations

from numba import njit

from nearlocal.kernels.intrinsics import tsc_begin, tsc_end
from nearlocal.workloads.selections import dense_fragments, sparse_fragments


@njit(cache=True)
def time_dense_metadata(table, outer, tensors, block_stride, piece, block_major, out, samples):
    """Each sample: block table -> merged fragment table, whole blocks."""
    n = 0
    for r in range(samples.size):
        t0 = tsc_begin()
        n = dense_fragments(table, outer, tensors, block_stride, piece, block_major, out)
        t1 = tsc_end()
        samples[r] = t1 - t0
    return n


@njit(cache=True)
def time_sparse_metadata(table, tokens, layer_offsets, tensors, block_stride, token_stride,
                         head_stride, unit, block_tokens, out, samples):
    """Each sample: block table + chosen tokens -> merged fragment table of (token, head) pieces."""
    n = 0
    for r in range(samples.size):
        t0 = tsc_begin()
        n = sparse_fragments(table, tokens, layer_offsets, tensors, block_stride, token_stride,
                             head_stride, unit, block_tokens, out)
        t1 = tsc_end()
        samples[r] = t1 - t0
    return n
