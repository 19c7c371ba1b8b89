"""io_uring through raw system calls (no liburing): the rings are mapped here and filled from
compiled code, so a timed interval holds only the submissions, the `io_uring_enter` waits and the
completions of one sample's requests.

ABI (include/uapi/linux/io_uring.h, stable since 5.1; IORING_OP_READ / WRITE since 5.6):
`io_uring_params` is 120 bytes: ten u32 (sq_entries, cq_entries, flags, sq_thread_cpu,
sq_thread_idle, features, wq_fd, resv[3]), then the SQ and CQ ring offsets (8 u32 + a u64 each).
An SQE is 64 bytes, a CQE 16. x86-64 syscall numbers: setup 425, enter 426.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from dataclasses import dataclass

import numpy as np

SYS_IO_URING_SETUP = 425
SYS_IO_URING_ENTER = 426
IORING_OFF_SQ_RING = 0
IORING_OFF_CQ_RING = 0x8000000
IORING_OFF_SQES = 0x10000000
IORING_FEAT_SINGLE_MMAP = 1
IORING_ENTER_GETEVENTS = 1
IORING_SETUP_COOP_TASKRUN = 1 << 8  # 5.19: no IPI to run completions' task work
IORING_SETUP_SINGLE_ISSUER = 1 << 12  # 6.0
IORING_SETUP_DEFER_TASKRUN = 1 << 13  # 6.1: task work runs only in io_uring_enter(GETEVENTS)
# What fio's io_uring engine (3.33) asks for, first, then what older kernels take (EINVAL)
SETUP_FLAG_CHOICES = (
    IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
    IORING_SETUP_COOP_TASKRUN,
    0,
)
SETUP_FLAG_NAMES = {IORING_SETUP_COOP_TASKRUN: "coop-taskrun",
                    IORING_SETUP_SINGLE_ISSUER: "single-issuer",
                    IORING_SETUP_DEFER_TASKRUN: "defer-taskrun"}
IORING_OP_READ = 22
IORING_OP_WRITE = 23
SQE_WORDS = 8  # 64 bytes as u64 words
CQE_BYTES = 16

_libc = ctypes.CDLL(None, use_errno=True)
# syscall(2) is variadic; glibc's x86-64 implementation only moves registers, so a fixed
# seven-long signature is what numba calls (through this ctypes pointer, in nopython code).
syscall = _libc.syscall
syscall.argtypes = [ctypes.c_long] * 7
syscall.restype = ctypes.c_long


@dataclass
class Ring:
    """A mapped io_uring. `sq` / `cq`: the ring memory as u32 words; `sqes` the SQE array as u64
    words (entries x 8); `layout`: word indices the kernel reads (see `layout_of`)."""

    fd: int
    entries: int
    flags: int  # the setup flags the kernel took
    sq: np.ndarray
    cq: np.ndarray
    sqes: np.ndarray
    layout: np.ndarray  # int64: sq head, sq tail, sq mask, cq head, cq tail, cq mask, cqes
    features: int
    _maps: tuple

    def close(self) -> None:
        maps, self._maps = self._maps, ()
        self.sq = self.cq = self.sqes = np.zeros(0, np.uint32)
        for one in maps:
            with contextlib.suppress(BufferError):  # a view still alive: goes with the process
                one.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def unavailable() -> str | None:
    """Why io_uring cannot be used by this process (sysctl, seccomp, an old kernel), or None."""
    try:
        ring = setup(2)
    except OSError as exc:
        return f"io_uring is not available here: {exc.strerror} ({exc.errno})"
    ring.close()
    return None


def flag_names(flags: int) -> str:
    return ", ".join(name for bit, name in SETUP_FLAG_NAMES.items() if flags & bit) or "none"


def setup(entries: int, flag_choices: tuple[int, ...] = (0,)) -> Ring:
    """A ring of `entries`, with the first of `flag_choices` the kernel takes (EINVAL: the next).
    The ring may be used only by the thread that made it when single-issuer is among them."""
    for flags in flag_choices:
        params = np.zeros(30, np.uint32)
        params[2] = flags
        fd = syscall(SYS_IO_URING_SETUP, entries, params.ctypes.data, 0, 0, 0, 0)
        if fd >= 0 or ctypes.get_errno() != 22:
            break
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err) + (" (kernel.io_uring_disabled or a seccomp filter)"
                                               if err in (1, 38) else ""))
    try:
        sq_entries, cq_entries, features = int(params[0]), int(params[1]), int(params[5])
        sq_off, cq_off = params[10:18].astype(np.int64), params[20:28].astype(np.int64)
        sq_size = int(sq_off[6]) + 4 * sq_entries
        cq_size = int(cq_off[5]) + CQE_BYTES * cq_entries
        prot, share = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | mmap.MAP_POPULATE
        if features & IORING_FEAT_SINGLE_MMAP:
            sq_map = mmap.mmap(fd, max(sq_size, cq_size), share, prot, offset=IORING_OFF_SQ_RING)
            cq_map = sq_map
        else:
            sq_map = mmap.mmap(fd, sq_size, share, prot, offset=IORING_OFF_SQ_RING)
            cq_map = mmap.mmap(fd, cq_size, share, prot, offset=IORING_OFF_CQ_RING)
        sqe_map = mmap.mmap(fd, SQE_WORDS * 8 * sq_entries, share, prot, offset=IORING_OFF_SQES)
    except BaseException:
        os.close(fd)
        raise
    sq = np.frombuffer(sq_map, np.uint32)
    cq = np.frombuffer(cq_map, np.uint32)
    sqes = np.frombuffer(sqe_map, np.uint64).reshape(sq_entries, SQE_WORDS)
    array = int(sq_off[6]) // 4
    sq[array:array + sq_entries] = np.arange(sq_entries, dtype=np.uint32)  # slot i = SQE i
    layout = np.array([sq_off[0] // 4, sq_off[1] // 4, sq[sq_off[2] // 4],
                       cq_off[0] // 4, cq_off[1] // 4, cq[cq_off[2] // 4], cq_off[5] // 4],
                      np.int64)
    maps = (sq_map, sqe_map) if cq_map is sq_map else (sq_map, cq_map, sqe_map)
    return Ring(fd, sq_entries, flags, sq, cq, sqes, layout, features, maps)
