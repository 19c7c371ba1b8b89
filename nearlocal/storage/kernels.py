"""Compiled, timed file I/O: libc pread/pwrite/posix_fadvise and io_uring_enter are called through
ctypes function pointers from nopython code, so every sample's interval (fenced rdtscp, as the CPU
methods' kernels) holds exactly the submissions and completion waits of its requests.

Requests are rows of (file offset, memory address, length); a sample is all of them. Before every
sample an untimed `settle` step can drop the file's cached pages (posix_fadvise DONTNEED on this
file only) and, after buffered writes, write them back first (fdatasync).
"""

from __future__ import annotations

import ctypes

import numpy as np
from numba import njit

from nearlocal.kernels.intrinsics import fetch_add, load_acquire, store_release, tsc_begin, tsc_end
from nearlocal.kernels.parallel import barrier_wait
from nearlocal.storage import uring

_libc = ctypes.CDLL(None, use_errno=True)
pread = _libc.pread
pread.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int64]
pread.restype = ctypes.c_int64
pwrite = _libc.pwrite
pwrite.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int64]
pwrite.restype = ctypes.c_int64
fadvise = _libc.posix_fadvise
fadvise.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
fadvise.restype = ctypes.c_int
fdatasync = _libc.fdatasync
fdatasync.argtypes = [ctypes.c_int]
fdatasync.restype = ctypes.c_int
syscall = uring.syscall

POSIX_FADV_DONTNEED = 4
SETTLE_NONE, SETTLE_DROP, SETTLE_SYNC_DROP = 0, 1, 2
ENTER_RETRIES = 1000  # io_uring_enter failures (EINTR) tolerated in one sample


@njit(nogil=True)
def settle(fd, mode):
    """Untimed, before a sample: write back (buffered writes) and drop this file's pages."""
    if mode == SETTLE_SYNC_DROP:
        fdatasync(fd)
    if mode != SETTLE_NONE:
        fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)


@njit(nogil=True)
def uring_pass(sq, cq, sqes, layout, ring_fd, file_fd, opcode, reqs, qd, status):
    """All requests through the ring with at most `qd` in flight; one io_uring_enter per round
    submits what was queued and waits for at least one completion. Returns 0, or 1 with
    status = (result, request + 1) of the first request that failed or came back short
    (request + 1 = -1: io_uring_enter kept failing)."""
    n = reqs.shape[0]
    sq_tail_i, sq_mask = layout[1], layout[2]
    cq_head_i, cq_tail_i, cq_mask, cqes_i = layout[3], layout[4], layout[5], layout[6]
    tail = np.int64(sq[sq_tail_i])
    head = np.int64(cq[cq_head_i])
    submitted = 0
    completed = 0
    queued = 0
    failures = 0
    failed = 0
    word0 = np.uint64(opcode) | (np.uint64(np.uint32(file_fd)) << np.uint64(32))
    while completed < n:
        while submitted < n and submitted - completed < qd:
            slot = tail & sq_mask
            sqes[slot, 0] = word0
            sqes[slot, 1] = np.uint64(reqs[submitted, 0])
            sqes[slot, 2] = np.uint64(reqs[submitted, 1])
            sqes[slot, 3] = np.uint64(reqs[submitted, 2])
            sqes[slot, 4] = np.uint64(submitted)
            sqes[slot, 5] = np.uint64(0)
            sqes[slot, 6] = np.uint64(0)
            sqes[slot, 7] = np.uint64(0)
            tail = (tail + 1) & 0xFFFFFFFF
            submitted += 1
            queued += 1
        store_release(sq, sq_tail_i, np.uint64(tail))
        got = syscall(uring.SYS_IO_URING_ENTER, ring_fd, queued, 1,
                      uring.IORING_ENTER_GETEVENTS, 0, 0)
        if got < 0:
            failures += 1
            if failures > ENTER_RETRIES:
                status[0] = got
                status[1] = -1
                return 1
        else:
            queued -= got
        ctail = np.int64(load_acquire(cq, cq_tail_i))
        while head != ctail:
            base = cqes_i + (head & cq_mask) * 4
            index = np.int64(cq[base]) | (np.int64(cq[base + 1]) << 32)
            result = np.int64(np.int32(cq[base + 2]))
            if result != reqs[index, 2] and (not failed or index + 1 < status[1]):
                failed = 1  # completions come in any order: name the lowest failed request
                status[0] = result
                status[1] = index + 1
            head = (head + 1) & 0xFFFFFFFF
            completed += 1
        store_release(cq, cq_head_i, np.uint64(head))
    return failed


@njit(nogil=True)
def time_uring(sq, cq, sqes, layout, ring_fd, file_fd, opcode, reqs, qd, mode, ticks, status):
    """n = len(ticks) samples; each interval: every request submitted and completed."""
    for s in range(ticks.shape[0]):
        settle(file_fd, mode)
        t0 = tsc_begin()
        failed = uring_pass(sq, cq, sqes, layout, ring_fd, file_fd, opcode, reqs, qd, status)
        t1 = tsc_end()
        ticks[s] = t1 - t0
        if failed:
            return 1
    return 0


@njit(nogil=True)
def _one(fd, write, reqs, i):
    if write:
        return pwrite(fd, np.uint64(reqs[i, 1]), np.uint64(reqs[i, 2]), reqs[i, 0])
    return pread(fd, np.uint64(reqs[i, 1]), np.uint64(reqs[i, 2]), reqs[i, 0])


@njit(nogil=True)
def thread_share(fd, write, reqs, mode, gate, taken, starts, ends, tid, nthreads, status):
    """One of `nthreads` threads: per sample, two barriers (thread 0 settles the file between
    them), then requests taken one at a time from the sample's shared counter (a queue: each
    thread keeps one request outstanding), pread/pwrite each; start and end TSC per thread.
    `status[tid]` holds this thread's first failed request (its lowest: a thread takes requests
    in increasing order), so the caller can name the lowest one whichever thread took it."""
    n = reqs.shape[0]
    for s in range(starts.shape[0]):
        barrier_wait(gate, np.uint64((2 * s + 1) * nthreads), True)
        if tid == 0:
            settle(fd, mode)
        barrier_wait(gate, np.uint64((2 * s + 2) * nthreads), True)
        t0 = tsc_begin()
        while True:
            i = np.int64(fetch_add(taken, s, np.uint64(1)))
            if i >= n:
                break
            got = _one(fd, write, reqs, i)
            if got != reqs[i, 2] and status[tid, 1] == 0:
                status[tid, 0] = got
                status[tid, 1] = i + 1
        t1 = tsc_end()
        starts[s, tid] = t0
        ends[s, tid] = t1
    return 0


@njit(nogil=True)
def time_sync(fd, write, reqs, mode, ticks, status):
    """Queue depth 1 in the calling thread: one pread/pwrite after another."""
    for s in range(ticks.shape[0]):
        settle(fd, mode)
        t0 = tsc_begin()
        for i in range(reqs.shape[0]):
            got = _one(fd, write, reqs, i)
            if got != reqs[i, 2]:
                status[0] = got
                status[1] = i + 1
                ticks[s] = tsc_end() - t0
                return 1
        ticks[s] = tsc_end() - t0
    return 0
