"""Submitting descriptors to a DSA work queue and waiting for their completion records.

The portal is the 4 KiB page of `/dev/dsa/wqX.Y`, mapped write-only. A dedicated WQ takes a
descriptor by `movdir64b` (the submitter must never overrun the queue: the device drops what
does not fit); a shared WQ takes it by `enqcmd`, which answers "retry" while the queue is full.
Completion is seen when the record's status byte turns non-zero: spin, spin with `pause`, or
`umonitor`/`umwait` on the record's line where the CPU has waitpkg.

Every piece here is an njit function taking the push (submission instruction) and the wait
(polling style) as arguments, so the same compiled loop drives the hardware and the software
work queue of the tests. The functions that contain movdir64b / enqcmd / umwait are compiled
only when `push_for` / `wait_for` hand them out, after the CPU flag check: LLVM aborts the whole
process if it is asked for an instruction the CPU lacks.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from dataclasses import dataclass

import numpy as np
from numba import njit

from nearlocal.dsa import uapi
from nearlocal.dsa.intrinsics import (
    acquire_u8,
    copy64,
    enqcmd,
    load_u8,
    load_u32,
    load_u64,
    movdir64b,
    store_u8,
    store_u32,
    store_u64,
    touch_write,
    umonitor,
    umwait,
)
from nearlocal.kernels.intrinsics import pause, sfence, tsc_begin, tsc_end

PORTAL_BYTES = 4096
PAGE_BYTES = 4096
MAP_POPULATE = 0x8000
GAVE_UP = np.uint64(0xFFFFFFFFFFFFFFFF)  # submit's answer when the WQ never accepted
UMWAIT_SLICE_TICKS = 100_000  # one umwait at most this long before re-checking the deadline

# Error codes the kernels leave in err[0] beside a device status (err[0] < 0x100).
ERR_TIMEOUT = 0x100
ERR_RETRIES = 0x101

# --- pushes: one descriptor into the portal; 1 means "retry" ----------------------------------


@njit(nogil=True, cache=True)
def push_movdir64b(portal, desc):
    """Dedicated WQ: descriptor and record stores must be visible before the device reads them."""
    sfence()
    movdir64b(portal, desc)
    return np.uint8(0)


@njit(nogil=True, cache=True)
def push_enqcmd(portal, desc):
    """Shared WQ: ZF (returned as 1) means the queue was full; nothing was enqueued."""
    sfence()
    return enqcmd(portal, desc)


# --- waits: poll one completion record's status byte ------------------------------------------


@njit(nogil=True, cache=True)
def _poll(idle, comp, timeout, stamps):
    """Read the status byte until it is set or `timeout` ticks pass, calling idle(comp) between
    reads. stamps[0] = polls, stamps[1] = ticks of the read that saw it. 0 = timed out."""
    start = tsc_end()
    polls = np.uint64(0)
    while True:
        t = tsc_end()
        status = acquire_u8(comp)
        polls += np.uint64(1)
        if status != 0:
            stamps[1] = tsc_end() - t
            stamps[0] = polls
            return status
        if t - start > timeout:
            stamps[0] = polls
            return np.uint8(0)
        idle(comp)


@njit(nogil=True, cache=True)
def _spin_idle(comp):
    pass


@njit(nogil=True, cache=True)
def _pause_idle(comp):
    pause()  # yields the core's resources to its sibling


@njit(nogil=True, cache=True)
def _umwait_idle(comp):
    umonitor(comp)
    if acquire_u8(comp) == 0:  # re-check after arming, or a write in between is missed
        umwait(1, tsc_end() + np.uint64(UMWAIT_SLICE_TICKS))


@njit(nogil=True, cache=True)
def wait_spin(comp, timeout, stamps):
    """Spin on the status byte."""
    return _poll(_spin_idle, comp, timeout, stamps)


@njit(nogil=True, cache=True)
def wait_pause(comp, timeout, stamps):
    """Spin with a pause between reads."""
    return _poll(_pause_idle, comp, timeout, stamps)


@njit(nogil=True, cache=True)
def wait_umwait(comp, timeout, stamps):
    """Monitor the record's line and umwait (C0.1) until the device writes it. Needs waitpkg:
    compiled only when chosen, after the flag check."""
    return _poll(_umwait_idle, comp, timeout, stamps)


# --- the driver: submit, wait, settle (page-fault retry), time -----------------------------


@njit(nogil=True, cache=True)
def submit(push, portal, desc, timeout):
    """Push until accepted; returns the retries (enqcmd on a full shared WQ), or GAVE_UP when
    the queue stayed full for `timeout` ticks."""
    retries = np.uint64(0)
    start = np.uint64(0)
    while push(portal, desc) != 0:
        if retries == 0:
            start = tsc_end()
        retries += np.uint64(1)
        if (retries & np.uint64(1023)) == 0 and tsc_end() - start > timeout:
            return GAVE_UP
        pause()
    return retries


@njit(nogil=True, cache=True)
def submit_and_wait(push, wait, portal, desc, comp, timeout, stamps):
    """One descriptor, synchronously: clear its record, submit, wait. Returns the status byte
    (0 when the wait timed out)."""
    store_u8(comp, 0)
    if submit(push, portal, desc, timeout) == GAVE_UP:
        return np.uint8(0)
    return wait(comp, timeout, stamps)


@njit(nogil=True, cache=True)
def _fail(err, status, index, comp):
    err[0] = status
    err[1] = index
    if comp != 0:
        err[2] = load_u32(comp + uapi.COMP_OFF_BYTES_COMPLETED)
        err[3] = load_u64(comp + uapi.COMP_OFF_FAULT_ADDR)
    return 1


@njit(nogil=True, cache=True)
def finish_partial(push, wait, portal, desc, comp, scratch, scomp, timeout, stamps, counters):
    """A memmove stopped by a page fault (no block-on-fault): touch the faulting page so the
    kernel maps it, then resubmit what is left from a scratch copy of the descriptor, until it
    completes. Returns the final status byte (SUCCESS, another error, 0 on timeout, or the
    page-fault status when touching does not help: more faults than the pages it spans)."""
    copy64(scratch, desc)
    word = load_u32(scratch + uapi.OFF_FLAGS_OPCODE)
    store_u32(scratch + uapi.OFF_FLAGS_OPCODE, word | uapi.FLAGS_RECORD)
    store_u64(scratch + uapi.OFF_COMPLETION_ADDR, scomp)
    status = load_u8(comp)
    record = comp
    # each touch maps one page of the source or the destination
    tries_left = 2 * (np.int64(load_u32(scratch + uapi.OFF_XFER_SIZE)) // PAGE_BYTES + 2)
    while (status & uapi.STATUS_MASK) == uapi.ST_PAGE_FAULT_NOBOF and tries_left > 0:
        tries_left -= 1
        counters[2] += np.uint64(1)
        done = load_u32(record + uapi.COMP_OFF_BYTES_COMPLETED)
        fault = load_u64(record + uapi.COMP_OFF_FAULT_ADDR)
        if (status & uapi.STATUS_WRITE) != 0 or \
                (load_u8(record + uapi.COMP_OFF_FAULT_INFO) & uapi.FAULT_INFO_WRITE) != 0:
            touch_write(fault)
        else:
            counters[3] += np.uint64(load_u8(fault))  # a read is enough to map it
        size = load_u32(scratch + uapi.OFF_XFER_SIZE) - done
        if (load_u8(record + uapi.COMP_OFF_RESULT) & uapi.RESULT_DESCENDING) == 0:
            store_u64(scratch + uapi.OFF_SRC, load_u64(scratch + uapi.OFF_SRC) + done)
            store_u64(scratch + uapi.OFF_DST, load_u64(scratch + uapi.OFF_DST) + done)
        store_u32(scratch + uapi.OFF_XFER_SIZE, size)
        status = submit_and_wait(push, wait, portal, scratch, scomp, timeout, stamps)
        record = scomp
    return status


@njit(nogil=True, cache=True)
def settle(push, wait, portal, status, index, desc, comp, mem_base, mcomp_base, m0, m1,
           scratch, scomp, timeout, stamps, counters, err):
    """Check one finished top-level descriptor; finish partial copies. 0 ok, 1 error (err set)."""
    if status == 0:
        return _fail(err, ERR_TIMEOUT, index, 0)
    code = status & uapi.STATUS_MASK
    if code == uapi.ST_SUCCESS:
        return 0
    if code == uapi.ST_PAGE_FAULT_NOBOF:
        final = finish_partial(push, wait, portal, desc, comp, scratch, scomp, timeout, stamps,
                               counters)
        if (final & uapi.STATUS_MASK) == uapi.ST_SUCCESS:
            return 0
        return _fail(err, ERR_TIMEOUT if final == 0 else final, index, scomp)
    if code == uapi.ST_BATCH_FAIL and m1 > m0:
        # Members carry CRAV without RCR: only the failed ones wrote their record.
        for m in range(m0, m1):
            mcomp = mcomp_base + np.uint64(64 * m)
            mstatus = load_u8(mcomp)
            if mstatus == 0:
                continue
            if (mstatus & uapi.STATUS_MASK) != uapi.ST_PAGE_FAULT_NOBOF:
                return _fail(err, mstatus, index, mcomp)
            final = finish_partial(push, wait, portal, mem_base + np.uint64(64 * m), mcomp,
                                   scratch, scomp, timeout, stamps, counters)
            if (final & uapi.STATUS_MASK) != uapi.ST_SUCCESS:
                return _fail(err, ERR_TIMEOUT if final == 0 else final, index, scomp)
            store_u8(mcomp, 0)
        return 0
    return _fail(err, status, index, comp)


@njit(nogil=True, cache=True)
def run_copies(push, wait, portal, top_base, comp_base, n_top, mem_base, mcomp_base, mstart,
               scratch, scomp, qd, timeout, ticks, parts, counters, err):
    """Time `ticks.size` repetitions of the work list: n_top descriptors (memmoves or batches),
    up to `qd` in flight, each waited for oldest-first.

    ticks[r]: the whole repetition. parts[r]: (submit, wait, last poll) summed over its
    descriptors — submit is the push loop (enqcmd retries included), wait runs from the wait's
    start to the status seen (the device's time, as the host sees it), last poll is the read that
    found the status set. counters: retries, polls, page-fault resubmits, sink. Returns 0, or 1
    with err = (status or ERR_*, descriptor index, bytes completed, fault address)."""
    stamps = np.zeros(2, np.uint64)
    for r in range(ticks.size):
        for i in range(n_top):
            store_u8(comp_base + np.uint64(64 * i), 0)
        submit_sum = np.uint64(0)
        wait_sum = np.uint64(0)
        poll_sum = np.uint64(0)
        issued = 0
        t0 = tsc_begin()
        for i in range(n_top):
            while issued < n_top and issued - i < qd:
                a = tsc_end()
                retries = submit(push, portal, top_base + np.uint64(64 * issued), timeout)
                submit_sum += tsc_end() - a
                if retries == GAVE_UP:
                    return _fail(err, ERR_RETRIES, issued, 0)
                counters[0] += retries
                issued += 1
            comp = comp_base + np.uint64(64 * i)
            b = tsc_end()
            status = wait(comp, timeout, stamps)
            wait_sum += tsc_end() - b
            poll_sum += stamps[1]
            counters[1] += stamps[0]
            if (status & uapi.STATUS_MASK) != uapi.ST_SUCCESS and \
                    settle(push, wait, portal, status, i, top_base + np.uint64(64 * i), comp,
                           mem_base, mcomp_base, mstart[i], mstart[i + 1], scratch, scomp,
                           timeout, stamps, counters, err):
                return 1
        t1 = tsc_end()
        ticks[r] = t1 - t0
        parts[r, 0] = submit_sum
        parts[r, 1] = wait_sum
        parts[r, 2] = poll_sum
    return 0


# --- choosing the instructions: only after the CPU flag check --------------------------------


def push_for(mode: str, has_flag) -> object:
    """The push for a WQ mode; raises if the CPU lacks its instruction (never compile it then)."""
    if mode == "dedicated":
        if not has_flag("movdir64b"):
            raise RuntimeError("a dedicated DSA WQ needs movdir64b, which this CPU lacks")
        return push_movdir64b
    if mode == "shared":
        if not has_flag("enqcmd"):
            raise RuntimeError("a shared DSA WQ needs enqcmd, which this CPU lacks")
        return push_enqcmd
    raise RuntimeError(f"unknown DSA WQ mode {mode!r}")


WAITS = ("spin", "pause", "umwait")


def wait_for(name: str, has_flag) -> object:
    if name == "umwait":
        if not has_flag("waitpkg"):
            raise RuntimeError("wait=umwait needs the waitpkg CPU flag, which this CPU lacks")
        return wait_umwait
    return {"spin": wait_spin, "pause": wait_pause}[name]


# --- the portal page -------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FAILED = ctypes.c_void_p(-1).value


@dataclass
class Portal:
    """An open `/dev/dsa/wqX.Y` with its portal page mapped write-only (never read: reads of a
    portal return all ones and stall)."""

    path: str
    fd: int
    address: int

    @classmethod
    def open(cls, path: str) -> Portal:
        try:
            fd = os.open(path, os.O_RDWR)
        except PermissionError:
            raise PermissionError(errno.EACCES, f"cannot open {path}: needs root or a udev rule "
                                  "granting read/write on /dev/dsa") from None
        address = _libc.mmap(None, PORTAL_BYTES, mmap.PROT_WRITE, mmap.MAP_SHARED | MAP_POPULATE,
                             fd, 0)
        if address in (None, MAP_FAILED):
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"mmap of the {path} portal failed: {os.strerror(err)}")
        return cls(path, fd, int(address))

    def close(self) -> None:
        if self.fd >= 0:
            _libc.munmap(ctypes.c_void_p(self.address), PORTAL_BYTES)
            os.close(self.fd)
            self.fd = -1


def describe_error(err: np.ndarray) -> str:
    """One line from a kernel's err array."""
    code, index, done, fault = (int(x) for x in err[:4])
    if code == ERR_TIMEOUT:
        return f"descriptor {index}: no completion within the timeout (is the WQ enabled?)"
    if code == ERR_RETRIES:
        return f"descriptor {index}: the shared WQ never accepted it"
    return (f"descriptor {index}: DSA status {uapi.status_name(code)} ({code:#x}), "
            f"{done} bytes completed, fault address {fault:#x}")
