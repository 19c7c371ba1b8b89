"""Address-level numba intrinsics for talking to a DSA work queue from compiled code.

Descriptors, completion records and the portal are reached by virtual address (the device works
on the same addresses through shared virtual memory). Completion status bytes are read with
acquire loads so the polling loop re-reads memory the device writes behind the compiler's back.

`movdir64b`, `enqcmd`, `umonitor` and `umwait` lower to LLVM's x86 intrinsics. LLVM aborts the
whole process when it cannot select one of them, so they may appear only in the kernels
(dsa/kernels/portal.py) that `nearlocal.dsa.portal` hands out after the CPU flag check; nothing
here is compiled on import.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from nearlocal.kernels.intrinsics import I8, I32, I64, to_ptr

I16 = ir.IntType(16)
_WIDTHS = {8: (I8, types.uint8), 16: (I16, types.uint16), 32: (I32, types.uint32),
           64: (I64, types.uint64)}


def _u64(builder: ir.IRBuilder, value: ir.Value, ty) -> ir.Value:
    """An integer argument of any numba int type as i64."""
    width = value.type.width
    if width == 64:
        return value
    return builder.zext(value, I64) if not getattr(ty, "signed", False) else builder.sext(value, I64)


def _load(bits: int, ordering: str | None):
    llty, nbty = _WIDTHS[bits]

    def make(typingctx, addr):
        if not isinstance(addr, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            ptr = to_ptr(builder, _u64(builder, args[0], addr), llty)
            if ordering is None:
                return builder.load(ptr, align=1)
            return builder.load_atomic(ptr, ordering, align=bits // 8)

        return nbty(addr), codegen

    return intrinsic(make)


def _store(bits: int, ordering: str | None):
    llty, _ = _WIDTHS[bits]

    def make(typingctx, addr, value):
        if not (isinstance(addr, types.Integer) and isinstance(value, types.Integer)):
            return None

        def codegen(context, builder, signature, args):
            ptr = to_ptr(builder, _u64(builder, args[0], addr), llty)
            val = _u64(builder, args[1], value)
            val = builder.trunc(val, llty) if bits < 64 else val
            if ordering is None:
                builder.store(val, ptr, align=1)
            else:
                builder.store_atomic(val, ptr, ordering, align=bits // 8)
            return context.get_dummy_value()

        return types.void(addr, value), codegen

    return intrinsic(make)


load_u8 = _load(8, None)
load_u32 = _load(32, None)
load_u64 = _load(64, None)
acquire_u8 = _load(8, "acquire")  # status bytes the device (or another thread) writes
acquire_u32 = _load(32, "acquire")
store_u8 = _store(8, None)
store_u32 = _store(32, None)
store_u64 = _store(64, None)
release_u8 = _store(8, "release")


@intrinsic
def touch_write(typingctx, addr):
    """Fault a page in for writing without changing it: `lock add byte [addr], 0`."""
    if not isinstance(addr, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ptr = to_ptr(builder, _u64(builder, args[0], addr), I8)
        builder.atomic_rmw("add", ptr, ir.Constant(I8, 0), "monotonic")
        return context.get_dummy_value()

    return types.void(addr), codegen


@intrinsic
def copy64(typingctx, dst, src):
    """Copy one 64-byte descriptor between addresses."""
    if not (isinstance(dst, types.Integer) and isinstance(src, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        to = to_ptr(builder, _u64(builder, args[0], dst), I8)
        frm = to_ptr(builder, _u64(builder, args[1], src), I8)
        cgutils.raw_memcpy(builder, to, frm, ir.Constant(I64, 64), 1)
        return context.get_dummy_value()

    return types.void(dst, src), codegen


def _x86(name: str, ret: ir.Type, params: list[ir.Type]):
    return lambda builder: cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ret, params), name)


@intrinsic
def movdir64b(typingctx, portal, desc):
    """64-byte direct store of the descriptor at `desc` to the portal (dedicated WQ submission).
    Needs the movdir64b CPU flag."""
    if not (isinstance(portal, types.Integer) and isinstance(desc, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        fn = _x86("llvm.x86.movdir64b", ir.VoidType(), [I8.as_pointer(), I8.as_pointer()])(builder)
        builder.call(fn, [to_ptr(builder, _u64(builder, args[0], portal), I8),
                          to_ptr(builder, _u64(builder, args[1], desc), I8)])
        return context.get_dummy_value()

    return types.void(portal, desc), codegen


@intrinsic
def enqcmd(typingctx, portal, desc):
    """Enqueue the descriptor to a shared WQ; returns 1 when the device said retry (ZF set: the
    queue was full), 0 when it accepted. Needs the enqcmd CPU flag."""
    if not (isinstance(portal, types.Integer) and isinstance(desc, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        fn = _x86("llvm.x86.enqcmd", I8, [I8.as_pointer(), I8.as_pointer()])(builder)
        return builder.call(fn, [to_ptr(builder, _u64(builder, args[0], portal), I8),
                                 to_ptr(builder, _u64(builder, args[1], desc), I8)])

    return types.uint8(portal, desc), codegen


@intrinsic
def umonitor(typingctx, addr):
    """Arm address monitoring on the line at `addr` (waitpkg)."""
    if not isinstance(addr, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        fn = _x86("llvm.x86.umonitor", ir.VoidType(), [I8.as_pointer()])(builder)
        builder.call(fn, [to_ptr(builder, _u64(builder, args[0], addr), I8)])
        return context.get_dummy_value()

    return types.void(addr), codegen


@intrinsic
def umwait(typingctx, control, deadline):
    """Wait for a write to the monitored line or until the TSC reaches `deadline`; control bit 0
    selects the lighter C0.1 state. Returns 1 when the deadline expired (CF). Needs waitpkg."""
    if not (isinstance(control, types.Integer) and isinstance(deadline, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        fn = _x86("llvm.x86.umwait", I8, [I32, I32, I32])(builder)
        ctrl = builder.trunc(_u64(builder, args[0], control), I32)
        tsc = _u64(builder, args[1], deadline)
        hi = builder.trunc(builder.lshr(tsc, ir.Constant(I64, 32)), I32)
        lo = builder.trunc(tsc, I32)
        return builder.call(fn, [ctrl, hi, lo])

    return types.uint8(control, deadline), codegen
