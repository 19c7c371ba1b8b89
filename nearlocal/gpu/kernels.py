"""numba-cuda kernels that move a whole fragment table in one launch (Beluga B9, B13-B14).

A fragment table is int64 (n, 3): (src offset, dst offset, length) in bytes, held in device memory.
Each fragment is moved by a group of `group` threads: a byte-wise head up to the first address
where source and destination are both aligned to the access width, then whole words of 16, 8 or
4 bytes (`width` is the widest allowed; a fragment whose source and destination disagree modulo
the width steps down to the widest width they agree on), then a byte-wise tail. The arrays are
byte arrays; on the device the word accesses are single vector loads and stores
(ld.global.v4.u32 for 16 B), emitted by the intrinsics below. Under numba-cuda's simulator
(NUMBA_ENABLE_CUDASIM=1) those intrinsics are replaced by byte loops with the same meaning, so
the head / body / tail partitioning and the table walk are tested on any machine.

The same walk serves zero-copy access: `sum_fragments` reads every byte of every fragment where
it lies (mapped host memory read in place over the bus) and `fill_fragments` writes them in place.
`spin` is the short blocking kernel that work is queued behind so that the host's enqueue cost
stays out of CUDA-event timings (the nvbandwidth / nvbench method); it also stands in for compute.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np
from numba import cuda, types

from nearlocal.errors import UsageError

try:  # numba-cuda >= 0.2x keeps its own config; older ones read numba's
    from numba.cuda.core import config as _cuda_config
except ImportError:  # pragma: no cover - depends on the numba-cuda version
    from numba.core import config as _cuda_config

SIMULATED = bool(_cuda_config.ENABLE_CUDASIM)
# a few fragments need a few blocks: that is the point, not an under-used GPU
warnings.filterwarnings("ignore", message=r"Grid size \d+ will likely result in GPU under")
WIDTHS = (16, 8, 4)  # the word widths a kernel may use; 1 is the byte-wise fallback
MAX_THREADS = 1024

_M8 = np.uint64(0x00FF00FF00FF00FF)
_M16 = np.uint64(0x0000FFFF0000FFFF)
_M32 = np.uint64(0xFFFFFFFF)
_S8, _S16, _S32 = np.uint64(8), np.uint64(16), np.uint64(32)
_ZERO = np.uint64(0)


# --- word access: vector intrinsics on the device, byte loops under the simulator -------------

if SIMULATED:

    def _sim_load(width: int):
        def load(src, index):
            lo = hi = 0
            for k in range(min(width, 8)):
                lo |= int(src[index + k]) << (8 * k)
            for k in range(8, width):
                hi |= int(src[index + k]) << (8 * (k - 8))
            return np.uint64(lo), np.uint64(hi)

        return load

    def _sim_store(width: int):
        def store(dst, index, lo, hi):
            for k in range(min(width, 8)):
                dst[index + k] = (int(lo) >> (8 * k)) & 0xFF
            for k in range(8, width):
                dst[index + k] = (int(hi) >> (8 * (k - 8))) & 0xFF

        return store

    def _globaltimer():
        return np.uint64(time.perf_counter_ns())

    _load16, _load8, _load4 = _sim_load(16), _sim_load(8), _sim_load(4)
    _store16, _store8, _store4 = _sim_store(16), _sim_store(8), _sim_store(4)

else:
    from llvmlite import ir

    try:
        from numba.cuda.extending import intrinsic
    except ImportError:  # pragma: no cover - older numba-cuda
        from numba.core.extending import intrinsic

    _I64 = ir.IntType(64)

    def _word_type(width: int) -> ir.Type:
        return ir.VectorType(ir.IntType(32), 4) if width == 16 else ir.IntType(8 * width)

    def _word_pointer(context, builder, arrty, arr, index, width: int):
        data = context.make_array(arrty)(context, builder, arr).data
        return builder.bitcast(builder.gep(data, [index]), _word_type(width).as_pointer())

    def _make_load(width: int):
        """load(src, byte_index) -> (lo, hi) uint64: one aligned `width`-byte load."""
        pair_type = types.UniTuple(types.uint64, 2)

        @intrinsic
        def load(typingctx, src, index):
            def codegen(context, builder, sig, args):
                ptr = _word_pointer(context, builder, sig.args[0], args[0], args[1], width)
                word = builder.load(ptr, align=width)
                if width == 16:
                    pair = builder.bitcast(word, ir.VectorType(_I64, 2))
                    lo = builder.extract_element(pair, ir.Constant(ir.IntType(32), 0))
                    hi = builder.extract_element(pair, ir.Constant(ir.IntType(32), 1))
                else:
                    lo = builder.zext(word, _I64) if width < 8 else word
                    hi = ir.Constant(_I64, 0)
                return context.make_tuple(builder, pair_type, [lo, hi])

            return pair_type(src, index), codegen

        return load

    def _make_store(width: int):
        """store(dst, byte_index, lo, hi): one aligned `width`-byte store."""

        @intrinsic
        def store(typingctx, dst, index, lo, hi):
            def codegen(context, builder, sig, args):
                ptr = _word_pointer(context, builder, sig.args[0], args[0], args[1], width)
                if width == 16:
                    pair = ir.Constant(ir.VectorType(_I64, 2), ir.Undefined)
                    pair = builder.insert_element(pair, args[2], ir.Constant(ir.IntType(32), 0))
                    pair = builder.insert_element(pair, args[3], ir.Constant(ir.IntType(32), 1))
                    word = builder.bitcast(pair, _word_type(16))
                else:
                    word = builder.trunc(args[2], _word_type(width)) if width < 8 else args[2]
                builder.store(word, ptr, align=width)
                return context.get_dummy_value()

            return types.void(dst, index, types.uint64, types.uint64), codegen

        return store

    @intrinsic
    def _globaltimer(typingctx):
        """%globaltimer: the GPU's nanosecond clock."""

        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(_I64, []), "mov.u64 $0, %globaltimer;", "=l",
                               side_effect=True)
            return builder.call(asm, [])

        return types.uint64(), codegen

    _load16, _load8, _load4 = _make_load(16), _make_load(8), _make_load(4)
    _store16, _store8, _store4 = _make_store(16), _make_store(8), _make_store(4)


@cuda.jit(device=True)
def _load_word(src, index, width):
    if width == 16:
        return _load16(src, index)
    if width == 8:
        return _load8(src, index)
    return _load4(src, index)


@cuda.jit(device=True)
def _store_word(dst, index, width, lo, hi):
    if width == 16:
        _store16(dst, index, lo, hi)
    elif width == 8:
        _store8(dst, index, lo, hi)
    else:
        _store4(dst, index, lo, hi)


@cuda.jit(device=True)
def _bytesum(x):
    """Sum of the 8 bytes of a uint64 (SWAR), so checksums do not depend on the access width."""
    x = (x & _M8) + ((x >> _S8) & _M8)
    x = (x & _M16) + ((x >> _S16) & _M16)
    return (x & _M32) + (x >> _S32)


@cuda.jit(device=True)
def _fragment_width(a, b, width):
    """The widest allowed width at which offsets a and b can both be aligned (16, 8, 4 or 1)."""
    w = width
    while w > 1 and ((a ^ b) & (w - 1)) != 0:
        w = w // 2 if w > 4 else 1
    return w


@cuda.jit(device=True)
def _split(a, n, w):
    """(head bytes, whole words) of an n-byte fragment starting at offset a, for width w; at width
    1 everything is tail."""
    if w == 1:
        return 0, 0
    head = (w - (a & (w - 1))) & (w - 1)
    if head > n:
        head = n
    return head, (n - head) // w


# --- kernels ------------------------------------------------------------------------------------

@cuda.jit
def _copy_kernel(dst, src, table, width, group):
    lane = cuda.threadIdx.x % group
    per_block = cuda.blockDim.x // group
    frag = cuda.blockIdx.x * per_block + cuda.threadIdx.x // group
    while frag < table.shape[0]:
        s = table[frag, 0]
        d = table[frag, 1]
        n = table[frag, 2]
        w = _fragment_width(s, d, width)
        head, words = _split(s, n, w)
        i = lane
        while i < head:
            dst[d + i] = src[s + i]
            i += group
        k = lane
        while k < words:
            off = head + k * w
            lo, hi = _load_word(src, s + off, w)
            _store_word(dst, d + off, w, lo, hi)
            k += group
        i = head + words * w + lane
        while i < n:
            dst[d + i] = src[s + i]
            i += group
        frag += cuda.gridDim.x * per_block


@cuda.jit
def _sum_kernel(src, table, width, group, sums):
    lane = cuda.threadIdx.x % group
    per_block = cuda.blockDim.x // group
    frag = cuda.blockIdx.x * per_block + cuda.threadIdx.x // group
    while frag < table.shape[0]:
        s = table[frag, 0]
        n = table[frag, 2]
        w = _fragment_width(s, s, width)
        head, words = _split(s, n, w)
        acc = _ZERO
        i = lane
        while i < head:
            acc += np.uint64(src[s + i])
            i += group
        k = lane
        while k < words:
            lo, hi = _load_word(src, s + head + k * w, w)
            acc += _bytesum(lo) + _bytesum(hi)
            k += group
        i = head + words * w + lane
        while i < n:
            acc += np.uint64(src[s + i])
            i += group
        cuda.atomic.add(sums, frag, acc)
        frag += cuda.gridDim.x * per_block


@cuda.jit
def _fill_kernel(dst, table, width, group, value):
    lane = cuda.threadIdx.x % group
    per_block = cuda.blockDim.x // group
    frag = cuda.blockIdx.x * per_block + cuda.threadIdx.x // group
    byte = np.uint8(value & 0xFF)
    word = np.uint64(value & 0xFF) * np.uint64(0x0101010101010101)
    while frag < table.shape[0]:
        d = table[frag, 1]
        n = table[frag, 2]
        w = _fragment_width(d, d, width)
        head, words = _split(d, n, w)
        i = lane
        while i < head:
            dst[d + i] = byte
            i += group
        k = lane
        while k < words:
            _store_word(dst, d + head + k * w, w, word, word)
            k += group
        i = head + words * w + lane
        while i < n:
            dst[d + i] = byte
            i += group
        frag += cuda.gridDim.x * per_block


@cuda.jit
def _spin_kernel(duration_ns, out):
    if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:
        start = _globaltimer()
        now = start
        while now - start < duration_ns:
            now = _globaltimer()
        out[0] = now - start


# --- host side: checks, launch geometry, launches, numpy references -----------------------------

@dataclass(frozen=True)
class LaunchPlan:
    """Launch geometry of one fragment kernel; recorded with the case."""

    blocks: int
    threads: int
    group: int  # threads per fragment
    width: int  # widest word access allowed (after the base pointers' alignment)

    def info(self) -> dict:
        return {"blocks": self.blocks, "threads": self.threads, "group": self.group,
                "width": self.width}


def validate_fragments(frags: np.ndarray, src_nbytes: int | None = None,
                       dst_nbytes: int | None = None) -> np.ndarray:
    """The table as contiguous int64 (n, 3), or UsageError naming the first bad fragment."""
    table = np.ascontiguousarray(np.asarray(frags), dtype=np.int64)
    if table.ndim != 2 or table.shape[1] != 3:
        raise UsageError(f"a fragment table has 3 columns (src offset, dst offset, length); "
                         f"got shape {table.shape}")
    if table.shape[0] == 0:
        raise UsageError("the fragment table is empty: give at least one fragment")
    src, dst, length = table[:, 0], table[:, 1], table[:, 2]
    bad = np.flatnonzero(length <= 0)
    if bad.size:
        i = int(bad[0])
        raise UsageError(f"fragment {i} has length {int(length[i])}: every fragment must move at "
                         "least 1 byte (zero-length fragments are rejected)")
    bad = np.flatnonzero((src < 0) | (dst < 0))
    if bad.size:
        i = int(bad[0])
        raise UsageError(f"fragment {i} has a negative offset ({int(src[i])}, {int(dst[i])})")
    for name, offsets, limit in (("source", src, src_nbytes), ("destination", dst, dst_nbytes)):
        if limit is None:
            continue
        bad = np.flatnonzero(offsets + length > limit)
        if bad.size:
            i = int(bad[0])
            raise UsageError(f"fragment {i} ends at byte {int(offsets[i] + length[i])} of the "
                             f"{name}, which holds {limit} bytes")
    order = np.argsort(dst, kind="stable")
    ends = dst[order] + length[order]
    clash = np.flatnonzero(ends[:-1] > dst[order][1:])
    if clash.size:
        a, b = int(order[clash[0]]), int(order[clash[0] + 1])
        raise UsageError(f"fragments {a} and {b} overlap in the destination (bytes "
                         f"{int(dst[b])}..{int(min(dst[a] + length[a], dst[b] + length[b])) - 1}): "
                         "each destination byte may be written by one fragment only")
    return table


def pointer_alignment(*pointers: int) -> int:
    """The widest access width (16, 8, 4, or 1) every base pointer is aligned to."""
    for width in WIDTHS:
        if all(int(p) % width == 0 for p in pointers):
            return width
    return 1


def plan_launch(table: np.ndarray, width: int = 16, threads: int = 128, group: int = 0,
                alignment: int = 16, max_blocks: int = 65535) -> LaunchPlan:
    """Geometry for a table: `group` threads per fragment (0: about one thread per word of the
    median fragment, a power of two dividing `threads`), enough blocks to give every fragment a
    group (grid-stride beyond `max_blocks`)."""
    if width not in WIDTHS:
        raise UsageError(f"load width {width} is not supported: valid widths are 4, 8, 16 (bytes)")
    if not 1 <= threads <= MAX_THREADS:
        raise UsageError(f"threads per block must be 1..{MAX_THREADS}, got {threads}")
    if group < 0 or (group and (group > threads or threads % group)):
        raise UsageError(f"group {group} must divide the {threads} threads per block (0: auto)")
    if not group:
        words = max(1, -(-int(np.median(table[:, 2])) // width))
        group = 1 << (words - 1).bit_length()
        group = min(group, threads)
        while threads % group:
            group //= 2
    per_block = threads // group
    blocks = max(1, min(-(-table.shape[0] // per_block), max_blocks))
    return LaunchPlan(blocks, threads, group, min(width, alignment))


def _configure(kernel, plan: LaunchPlan, stream):
    return kernel[plan.blocks, plan.threads] if stream is None else \
        kernel[plan.blocks, plan.threads, stream]


def copy_fragments(dst, src, table, plan: LaunchPlan, stream=None) -> None:
    """Launch: every fragment of `table` from `src` to `dst` (uint8 device arrays)."""
    _configure(_copy_kernel, plan, stream)(dst, src, table, plan.width, plan.group)


def sum_fragments(src, table, plan: LaunchPlan, sums, stream=None) -> None:
    """Launch: add the bytes of fragment i (read where they lie) into sums[i] (uint64)."""
    _configure(_sum_kernel, plan, stream)(src, table, plan.width, plan.group, sums)


def fill_fragments(dst, table, plan: LaunchPlan, value: int, stream=None) -> None:
    """Launch: write byte `value` over every fragment's destination range, in place."""
    _configure(_fill_kernel, plan, stream)(dst, table, plan.width, plan.group, value & 0xFF)


def spin(duration_ns: int, out, stream=None) -> None:
    """Launch: one thread busy-waits `duration_ns` on %globaltimer and writes what it waited."""
    kernel = _spin_kernel[1, 1] if stream is None else _spin_kernel[1, 1, stream]
    kernel(np.uint64(duration_ns), out)


def reference_copy(dst: np.ndarray, src: np.ndarray, table: np.ndarray) -> np.ndarray:
    """What copy_fragments must produce, in numpy."""
    out = dst.copy()
    for s, d, n in table:
        out[d:d + n] = src[s:s + n]
    return out


def reference_sums(src: np.ndarray, table: np.ndarray) -> np.ndarray:
    return np.array([int(src[s:s + n].sum(dtype=np.uint64)) for s, _, n in table], np.uint64)


def fragments_match(dst: np.ndarray, src: np.ndarray, table: np.ndarray) -> int | None:
    """Index of the first fragment whose destination bytes differ from its source, or None."""
    for i, (s, d, n) in enumerate(table):
        if not np.array_equal(dst[d:d + n], src[s:s + n]):
            return i
    return None
