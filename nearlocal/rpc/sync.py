"""Ordered 64-bit words in shared memory, and the two visibility protocols built on them.

`coherent`: release stores and acquire loads are enough (one cache-coherent host).
`flush`: what a non-coherent pool (CXL 2.0 shared between hosts) needs: the writer's data leaves
its cache (nontemporal stores, sfence) before the flag flips, and the reader invalidates its copy
(clflushopt, mfence) before every load of shared data. The rule holds for every shared word: one
written with cached stores (an area initialised in place) is flushed (`flush_written`) before
anyone may read it, and one read is invalidated first, even a word this agent owns if another
agent (a previous owner) may have written it last.

Words are addressed as indices into a uint64 view of the region; the same memory as a uint8 view
is passed for the cache-line instructions (the range intrinsics take bytes).
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from nearlocal.kernels.intrinsics import clflushopt_range, mfence, sfence
from nearlocal.rpc.protocols import COHERENT, FLUSH, PROTOCOLS, protocol_code  # noqa: F401 (re-exported)

I32 = ir.IntType(32)
I64 = ir.IntType(64)
LINE = 64
WORDS_PER_LINE = LINE // 8



def _is_words(array) -> bool:
    return isinstance(array, types.Array) and array.dtype == types.uint64 and array.ndim == 1 \
        and array.layout == "C"


def _word_ptr(context, builder, arrty, array, index) -> ir.Value:
    data = context.make_array(arrty)(context, builder, array).data
    return builder.gep(data, [index])


@intrinsic
def load_acquire(typingctx, words, index):
    """`load atomic i64 acquire`: later loads and stores stay after it (plain mov on x86)."""
    if not _is_words(words):
        return None

    def codegen(context, builder, signature, args):
        return builder.load_atomic(_word_ptr(context, builder, words, args[0], args[1]),
                                   "acquire", 8)

    return types.uint64(words, types.int64), codegen


@intrinsic
def store_release(typingctx, words, index, value):
    """`store atomic i64 release`: earlier loads and stores are visible before it."""
    if not _is_words(words):
        return None

    def codegen(context, builder, signature, args):
        builder.store_atomic(args[2], _word_ptr(context, builder, words, args[0], args[1]),
                             "release", 8)
        return context.get_dummy_value()

    return types.void(words, types.int64, types.uint64), codegen


@intrinsic
def nt_store_word(typingctx, words, index, value):
    """A nontemporal 8-byte store (movnti): goes to memory through the WC buffers, not the cache."""
    if not _is_words(words):
        return None

    def codegen(context, builder, signature, args):
        store = builder.store(args[2], _word_ptr(context, builder, words, args[0], args[1]),
                              align=8)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(I32, 1)]))
        return context.get_dummy_value()

    return types.void(words, types.int64, types.uint64), codegen


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


@intrinsic
def compiler_barrier(typingctx):
    """No instruction; keeps the compiler from moving memory accesses across it (x86 keeps
    stores in order and loads in order, so this is the seqlock's write and read barrier)."""

    def codegen(context, builder, signature, args):
        builder.asm(ir.FunctionType(ir.VoidType(), []), "", "~{memory}", [], side_effect=True)
        return context.get_dummy_value()

    return types.void(), codegen
