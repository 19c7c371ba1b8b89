"""The compiled code of the workloads: a selection's step from block table to fragment table
(workloads/selections.py builds its inputs) and the kv-metadata method's timed kernels around
it. Imported when a read is built or a session opens, so registering the method compiles
nothing."""

from __future__ import annotations

from numba import njit

from nearlocal.kernels.intrinsics import tsc_begin, tsc_end


@njit(cache=True)
def _emit(out, n, src, dst, length, same_tensor):
    """Append (src, dst, length) to out[:n], merged with out[n-1] when adjacent at both ends and
    in the same tensor."""
    if (same_tensor and n > 0 and out[n - 1, 0] + out[n - 1, 2] == src
            and out[n - 1, 1] + out[n - 1, 2] == dst):
        out[n - 1, 2] += length
        return n
    out[n, 0] = src
    out[n, 1] = dst
    out[n, 2] = length
    return n + 1


@njit(cache=True)
def dense_fragments(table, outer, tensors, block_stride, piece, block_major, out):
    """Whole-block pieces for the block ids in `table`; returns the fragment count in out.
    tensors[o]: the tensor outer piece o lies in."""
    n = 0
    dst = 0
    last = -1
    if block_major:
        for b in range(table.size):
            for o in range(outer.size):
                n = _emit(out, n, outer[o] + table[b] * block_stride, dst, piece,
                          tensors[o] == last)
                last = tensors[o]
                dst += piece
    else:
        for o in range(outer.size):
            for b in range(table.size):
                n = _emit(out, n, outer[o] + table[b] * block_stride, dst, piece,
                          tensors[o] == last)
                last = tensors[o]
                dst += piece
    return n


@njit(cache=True)
def sparse_fragments(table, tokens, layer_offsets, tensors, block_stride, token_stride, head_stride,
                     unit, block_tokens, out):
    """(token, head) pieces: tokens[l, h, :] are sorted token positions in the sequence, mapped
    through the block table; local order (layer, part, head, token); tensors[l]: the tensor
    layer l lies in. Returns the count."""
    n = 0
    dst = 0
    last = -1
    for li in range(layer_offsets.shape[0]):
        same = tensors[li] == last
        last = tensors[li]
        for p in range(layer_offsets.shape[1]):
            base = layer_offsets[li, p]
            for h in range(tokens.shape[1]):
                head = base + h * head_stride
                for j in range(tokens.shape[2]):
                    t = tokens[li, h, j]
                    src = head + table[t // block_tokens] * block_stride + (t % block_tokens) * token_stride
                    n = _emit(out, n, src, dst, unit, same)
                    same = True
                    dst += unit
    return n


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
