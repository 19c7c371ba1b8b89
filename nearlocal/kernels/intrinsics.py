"""x86 instructions as numba intrinsics, so the timed loops run exactly the instruction they claim.

Each range intrinsic emits the whole access loop in LLVM IR: byte and 8-byte head until the
primary pointer is 64-byte aligned, a body unrolled over four 64-byte vectors, then an 8-byte and
byte tail. Reads fold into a vector accumulator that the caller must keep live (a dead accumulator
lets LLVM delete the loop). Instructions that need a CPU feature (clflushopt, clwb, movdir64b) are
emitted only inside kernels that the registry compiles after checking the flag: LLVM aborts the
whole process when it cannot select an instruction.
"""

from __future__ import annotations

from collections.abc import Callable

import llvmlite.binding as llvm
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

# numba initialises the target but not its asm parser, which inline asm (rdtscp, fences) needs.
llvm.initialize_native_asmparser()

I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
VEC = ir.VectorType(I64, 8)  # one 64-byte cache line
LINE = 64
UNROLL = 4


def _is_bytes(array) -> bool:
    """A 1-D contiguous uint8 array, writable or not (a region mapped read-only is still readable)."""
    return isinstance(array, types.Array) and array.dtype == types.uint8 and array.ndim == 1 \
        and array.layout == "C"


def _asm(builder: ir.IRBuilder, text: str, constraint: str = "~{memory}") -> None:
    builder.asm(ir.FunctionType(ir.VoidType(), []), text, constraint, [], side_effect=True)


def _read_tsc(builder: ir.IRBuilder, text: str) -> ir.Value:
    pair = ir.LiteralStructType([I32, I32])
    result = builder.asm(
        ir.FunctionType(pair, []), text, "={eax},={edx},~{ecx},~{memory}", [], side_effect=True
    )
    lo = builder.zext(builder.extract_value(result, 0), I64)
    hi = builder.zext(builder.extract_value(result, 1), I64)
    return builder.or_(builder.shl(hi, ir.Constant(I64, 32)), lo)


@intrinsic
def tsc_begin(typingctx):
    """Drain earlier memory operations, then a fenced rdtscp: the start of a timed interval."""

    def codegen(context, builder, signature, args):
        return _read_tsc(builder, "mfence\n\tlfence\n\trdtscp\n\tlfence")

    return types.uint64(), codegen


@intrinsic
def tsc_begin_nodrain(typingctx):
    """A fenced rdtscp that does not wait for earlier stores to drain (no mfence): back-to-back
    repetitions, where the previous one's stores may still be leaving the core. The empty interval
    (lfence, rdtscp) is the same as after tsc_begin, whose mfence lies before its first read."""

    def codegen(context, builder, signature, args):
        return _read_tsc(builder, "lfence\n\trdtscp\n\tlfence")

    return types.uint64(), codegen


@intrinsic
def tsc_end(typingctx):
    """rdtscp waits for earlier instructions to execute; lfence keeps later ones from starting."""

    def codegen(context, builder, signature, args):
        return _read_tsc(builder, "rdtscp\n\tlfence")

    return types.uint64(), codegen


def _fence(text: str):
    @intrinsic
    def fence(typingctx):
        def codegen(context, builder, signature, args):
            _asm(builder, text)
            return context.get_dummy_value()

        return types.void(), codegen

    return fence


mfence = _fence("mfence")
sfence = _fence("sfence")
lfence = _fence("lfence")
pause = _fence("pause")


def _data_address(context, builder, arrty, value) -> ir.Value:
    array = context.make_array(arrty)(context, builder, value)
    return builder.ptrtoint(array.data, I64)


def to_ptr(builder: ir.IRBuilder, address: ir.Value, pointee: ir.Type) -> ir.Value:
    """An integer address as a pointer to `pointee` (DSA's intrinsics build on it too)."""
    return builder.inttoptr(address, pointee.as_pointer())


# The name numba's on-disk caches written before the rename refer to (a cached kernel's pickled
# intrinsics): without it a box upgraded in place fails to load those caches instead of
# recompiling them
_ptr = to_ptr


def _nontemporal(builder: ir.IRBuilder, instruction) -> None:
    instruction.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(I32, 1)]))


def _counted_loop(builder: ir.IRBuilder, count: ir.Value, body: Callable[[ir.Value], None]) -> None:
    with cgutils.for_range(builder, count) as loop:
        body(loop.index)


def _emit_ranged(
    builder: ir.IRBuilder,
    primary: ir.Value,
    nbytes: ir.Value,
    line_op: Callable[[ir.Value], None],
    word_op: Callable[[ir.Value], None],
    byte_op: Callable[[ir.Value], None],
) -> None:
    """Cover [0, nbytes) with ops at byte offsets; line ops only where `primary + off` is 64-aligned."""
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    umin = lambda a, b: builder.select(builder.icmp_unsigned("<", a, b), a, b)  # noqa: E731
    neg = builder.sub(c(0), primary)
    head_bytes = umin(nbytes, builder.and_(neg, c(7)))
    _counted_loop(builder, head_bytes, byte_op)
    offset, remaining = head_bytes, builder.sub(nbytes, head_bytes)

    to_line = builder.lshr(builder.and_(builder.sub(c(0), builder.add(primary, offset)), c(63)), c(3))
    head_words = umin(builder.lshr(remaining, c(3)), to_line)
    base = offset
    _counted_loop(builder, head_words, lambda i: word_op(builder.add(base, builder.shl(i, c(3)))))
    offset = builder.add(offset, builder.shl(head_words, c(3)))
    remaining = builder.sub(remaining, builder.shl(head_words, c(3)))

    lines = builder.lshr(remaining, c(6))
    groups = builder.lshr(lines, c(2))
    group_base = offset

    def group(i: ir.Value) -> None:
        start = builder.add(group_base, builder.mul(i, c(LINE * UNROLL)))
        for k in range(UNROLL):
            line_op(builder.add(start, c(k * LINE)))

    _counted_loop(builder, groups, group)
    offset = builder.add(offset, builder.mul(groups, c(LINE * UNROLL)))
    line_base = offset
    leftover_lines = builder.and_(lines, c(UNROLL - 1))
    _counted_loop(builder, leftover_lines, lambda i: line_op(builder.add(line_base, builder.shl(i, c(6)))))
    offset = builder.add(offset, builder.shl(leftover_lines, c(6)))
    remaining = builder.and_(remaining, c(63))

    word_base = offset
    tail_words = builder.lshr(remaining, c(3))
    _counted_loop(builder, tail_words, lambda i: word_op(builder.add(word_base, builder.shl(i, c(3)))))
    byte_base = builder.add(offset, builder.shl(tail_words, c(3)))
    _counted_loop(builder, builder.and_(remaining, c(7)), lambda i: byte_op(builder.add(byte_base, i)))


def _read_intrinsic(nontemporal: bool):
    def make(typingctx, array, offset, nbytes):
        if not _is_bytes(array):
            return None

        def codegen(context, builder, signature, args):
            address = builder.add(_data_address(context, builder, array, args[0]), args[1])
            vec_acc = cgutils.alloca_once_value(builder, ir.Constant(VEC, None))
            acc = cgutils.alloca_once_value(builder, ir.Constant(I64, 0))

            def line(off):
                load = builder.load(to_ptr(builder, builder.add(address, off), VEC), align=LINE)
                if nontemporal:
                    _nontemporal(builder, load)
                builder.store(builder.xor(builder.load(vec_acc), load), vec_acc)

            def word(off):
                value = builder.load(to_ptr(builder, builder.add(address, off), I64), align=8)
                builder.store(builder.xor(builder.load(acc), value), acc)

            def byte(off):
                value = builder.zext(builder.load(to_ptr(builder, builder.add(address, off), I8)), I64)
                builder.store(builder.xor(builder.load(acc), value), acc)

            _emit_ranged(builder, address, args[2], line, word, byte)
            folded = builder.load(acc)
            vector = builder.load(vec_acc)
            for lane in range(8):
                folded = builder.xor(folded, builder.extract_element(vector, ir.Constant(I32, lane)))
            return folded

        return types.uint64(array, types.int64, types.int64), codegen

    return intrinsic(make)


read_range = _read_intrinsic(nontemporal=False)
read_range.__doc__ = "Read [offset, offset+nbytes) with 64-byte vector loads; returns an xor of it."
nt_read_range = _read_intrinsic(nontemporal=True)
nt_read_range.__doc__ = "As read_range with nontemporal (movntdqa) line loads."


def _write_intrinsic(nontemporal: bool, writeback: bool):
    def make(typingctx, array, offset, nbytes, value):
        if not _is_bytes(array):
            return None

        def codegen(context, builder, signature, args):
            address = builder.add(_data_address(context, builder, array, args[0]), args[1])
            word_value = args[3]
            line_value = cgutils.pack_array(builder, [word_value] * 8)
            line_value = builder.load(builder.bitcast(cgutils.alloca_once_value(builder, line_value),
                                                      VEC.as_pointer()))
            clwb = None
            if writeback:
                clwb = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(ir.VoidType(), [I8.as_pointer()]), "llvm.x86.clwb"
                )

            def line(off):
                target = builder.add(address, off)
                store = builder.store(line_value, to_ptr(builder, target, VEC), align=LINE)
                if nontemporal:
                    _nontemporal(builder, store)

            def word(off):
                store = builder.store(word_value, to_ptr(builder, builder.add(address, off), I64), align=8)
                if nontemporal:
                    _nontemporal(builder, store)

            def byte(off):
                builder.store(builder.trunc(word_value, I8), to_ptr(builder, builder.add(address, off), I8))

            _emit_ranged(builder, address, args[2], line, word, byte)
            if writeback:  # every line the range touches, once (head and tail lines included)
                _emit_flush_lines(builder, clwb, address, args[2])
            return context.get_dummy_value()

        return types.void(array, types.int64, types.int64, types.uint64), codegen

    return intrinsic(make)


write_range = _write_intrinsic(nontemporal=False, writeback=False)
nt_write_range = _write_intrinsic(nontemporal=True, writeback=False)
write_clwb_range = _write_intrinsic(nontemporal=False, writeback=True)


def _emit_flush_lines(builder: ir.IRBuilder, fn, address: ir.Value, nbytes: ir.Value) -> None:
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    first = builder.and_(address, c(~63))
    end = builder.and_(builder.add(builder.add(address, nbytes), c(63)), c(~63))
    count = builder.lshr(builder.sub(end, first), c(6))
    empty = builder.icmp_unsigned("==", nbytes, c(0))
    count = builder.select(empty, c(0), count)
    _counted_loop(builder, count, lambda i: builder.call(
        fn, [to_ptr(builder, builder.add(first, builder.shl(i, c(6))), I8)]))


def _flush_intrinsic(llvm_name: str):
    def make(typingctx, array, offset, nbytes):
        if not _is_bytes(array):
            return None

        def codegen(context, builder, signature, args):
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [I8.as_pointer()]), llvm_name
            )
            address = builder.add(_data_address(context, builder, array, args[0]), args[1])
            _emit_flush_lines(builder, fn, address, args[2])
            return context.get_dummy_value()

        return types.void(array, types.int64, types.int64), codegen

    return intrinsic(make)


clflush_range = _flush_intrinsic("llvm.x86.sse2.clflush")
clflushopt_range = _flush_intrinsic("llvm.x86.clflushopt")
clwb_range = _flush_intrinsic("llvm.x86.clwb")


def _copy_intrinsic(kind: str):
    """kind: "memcpy" (LLVM's memcpy), "movdir64b" (64-byte direct stores from src), or "nt"
    (loads from src, nontemporal stores into dst: vmovntdq lines, movnti words, plain bytes)."""

    def make(typingctx, dst, dst_offset, src, src_offset, nbytes):
        if not (_is_bytes(dst) and _is_bytes(src)):
            return None

        def codegen(context, builder, signature, args):
            to = builder.add(_data_address(context, builder, dst, args[0]), args[1])
            frm = builder.add(_data_address(context, builder, src, args[2]), args[3])
            if kind == "memcpy":
                cgutils.raw_memcpy(builder, to_ptr(builder, to, I8), to_ptr(builder, frm, I8), args[4], 1)
                return context.get_dummy_value()
            if kind == "movdir64b":
                movdir64b = cgutils.get_or_insert_function(
                    builder.module,
                    ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I8.as_pointer()]),
                    "llvm.x86.movdir64b",
                )

                def line(off):
                    builder.call(movdir64b, [to_ptr(builder, builder.add(to, off), I8),
                                             to_ptr(builder, builder.add(frm, off), I8)])
            else:  # the source may sit at any alignment: unaligned vector loads, aligned nt stores
                def line(off):
                    value = builder.load(to_ptr(builder, builder.add(frm, off), VEC), align=1)
                    store = builder.store(value, to_ptr(builder, builder.add(to, off), VEC), align=LINE)
                    _nontemporal(builder, store)

            def word(off):
                value = builder.load(to_ptr(builder, builder.add(frm, off), I64), align=1)
                store = builder.store(value, to_ptr(builder, builder.add(to, off), I64), align=8)
                if kind == "nt":
                    _nontemporal(builder, store)

            def byte(off):
                value = builder.load(to_ptr(builder, builder.add(frm, off), I8))
                builder.store(value, to_ptr(builder, builder.add(to, off), I8))

            _emit_ranged(builder, to, args[4], line, word, byte)
            return context.get_dummy_value()

        return types.void(dst, types.int64, src, types.int64, types.int64), codegen

    return intrinsic(make)


memcpy_range = _copy_intrinsic("memcpy")
movdir64b_range = _copy_intrinsic("movdir64b")
nt_copy_range = _copy_intrinsic("nt")
nt_copy_range.__doc__ = "Copy src -> dst with nontemporal stores (no fence: the caller's sfence)."


# --- ordered words: the atomics of flags, barriers and ring indices shared with another agent ---

def _is_words(array, dtypes=(types.uint64,)) -> bool:
    """A 1-D contiguous array of one of `dtypes`, addressed by element index."""
    return isinstance(array, types.Array) and array.dtype in dtypes and array.ndim == 1 \
        and array.layout == "C"


_ORDERED = (types.uint32, types.uint64)  # the widths an acquire load / release store takes


def _word_ptr(context, builder, arrty, array, index) -> ir.Value:
    data = context.make_array(arrty)(context, builder, array).data
    return builder.gep(data, [index])


@intrinsic
def load_acquire(typingctx, words, index):
    """`load atomic acquire` of words[index] (uint64 or uint32 words: a flag, a ring index the
    kernel advances): later loads and stores stay after it (plain mov on x86)."""
    if not _is_words(words, _ORDERED):
        return None

    def codegen(context, builder, signature, args):
        return builder.load_atomic(_word_ptr(context, builder, words, args[0], args[1]),
                                   "acquire", words.dtype.bitwidth // 8)

    return words.dtype(words, types.int64), codegen


@intrinsic
def store_release(typingctx, words, index, value):
    """`store atomic release` of a uint64 value into words[index] (truncated to uint32 words: an
    io_uring ring index): earlier loads and stores are visible before it."""
    if not _is_words(words, _ORDERED):
        return None

    def codegen(context, builder, signature, args):
        bits = words.dtype.bitwidth
        value = args[2] if bits == 64 else builder.trunc(args[2], ir.IntType(bits))
        builder.store_atomic(value, _word_ptr(context, builder, words, args[0], args[1]),
                             "release", bits // 8)
        return context.get_dummy_value()

    return types.void(words, types.int64, types.uint64), codegen


@intrinsic
def fetch_add(typingctx, words, index, value):
    """`atomicrmw add` (lock xadd) on words[index]; returns the old value."""
    if not (isinstance(words, types.Array) and words.dtype == types.uint64):
        return None

    def codegen(context, builder, signature, args):
        return builder.atomic_rmw("add", _word_ptr(context, builder, words, args[0], args[1]),
                                  args[2], "seq_cst")

    return types.uint64(words, types.int64, types.uint64), codegen


@intrinsic
def nt_store_word(typingctx, words, index, value):
    """A nontemporal 8-byte store (movnti): goes to memory through the WC buffers, not the cache."""
    if not _is_words(words):
        return None

    def codegen(context, builder, signature, args):
        store = builder.store(args[2], _word_ptr(context, builder, words, args[0], args[1]),
                              align=8)
        _nontemporal(builder, store)
        return context.get_dummy_value()

    return types.void(words, types.int64, types.uint64), codegen


@intrinsic
def compiler_barrier(typingctx):
    """No instruction; keeps the compiler from moving memory accesses across it (x86 keeps
    stores in order and loads in order, so this is the seqlock's write and read barrier)."""

    def codegen(context, builder, signature, args):
        _asm(builder, "")
        return context.get_dummy_value()

    return types.void(), codegen


@njit(cache=True, nogil=True, inline="always")
def deadline_passed(start, limit_ticks):
    """The clock check of kernels/spin.py's spin_until (every wait with a deadline: rpc's slots,
    rack's handoff, rdma's completions, dsa's submit and record polls), made every
    SPINS_PER_CHECK spins so that a fast answer costs no TSC read: returns (start, passed). A
    `start` of 0 is a wait not yet on the clock: this reading starts it. Inlined, scalars only: a
    timed wait holds the same instructions as with the check written out."""
    now = tsc_end()
    if start == 0:
        return now, False
    return start, now - start > limit_ticks
