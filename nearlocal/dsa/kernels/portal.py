"""dsa's compiled driver: pushing descriptors into a work queue's portal and waiting for their
completion records (nearlocal.dsa.portal maps the portal and hands these out).

A dedicated WQ takes a descriptor by `movdir64b` (the submitter must never overrun the queue:
the device drops what does not fit); a shared WQ takes it by `enqcmd`, which answers "retry"
while the queue is full. Completion is seen when the record's status byte turns non-zero: spin,
spin with `pause`, or `umonitor`/`umwait` on the record's line where the CPU has waitpkg.

Every piece takes the push (submission instruction) and the wait (polling style) as arguments,
so the same compiled loop drives the hardware and the software work queue of the tests. The
functions that contain movdir64b / enqcmd / umwait are compiled only when `push_for` /
`wait_for` (dsa/portal.py) hand them out, after the CPU flag check: LLVM aborts the whole process
if it is asked for an instruction the CPU lacks.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from nearlocal.dsa import uapi
from nearlocal.dsa.kernels.intrinsics import (
    acquire_u8,
    acquire_u32,
    copy64,
    enqcmd,
    load_u8,
    load_u32,
    load_u64,
    movdir64b,
    release_u8,
    store_u8,
    store_u32,
    store_u64,
    touch_write,
    umonitor,
    umwait,
)
from nearlocal.kernels.intrinsics import pause, sfence, tsc_begin, tsc_end
from nearlocal.kernels.spin import WAIT_READY, never, spin_until

PAGE_BYTES = 4096
GAVE_UP = np.uint64(0xFFFFFFFFFFFFFFFF)  # submit's answer when the WQ never accepted
UMWAIT_SLICE_TICKS = 100_000  # one umwait at most this long before re-checking the deadline

# Error codes the kernels leave in err[0] beside a device status (err[0] < 0x100).
ERR_TIMEOUT = 0x100
ERR_RETRIES = 0x101

# The software double's portal page (dsa/softqueue.py): doorbell byte, credits and mode words.
SOFT_DOORBELL, SOFT_CREDITS, SOFT_SHARED = 64, 68, 72


# --- pushes: one try at putting a descriptor into the portal ---------------------------------
# A push is a ready check of kernels/spin.py (`push((portal, desc)) -> (taken, retry)`): `submit`
# spins through `spin_until` with it, so the queue-full retry is the one spin-wait of the tree.


@njit(nogil=True, cache=True)
def push_movdir64b(args):
    """Dedicated WQ: descriptor and record stores must be visible before the device reads them.
    Always taken (the submitter must not overrun the queue)."""
    portal, desc = args
    sfence()
    movdir64b(portal, desc)
    return True, np.uint8(0)


@njit(nogil=True, cache=True)
def push_enqcmd(args):
    """Shared WQ: ZF (retry = 1) means the queue was full; nothing was enqueued."""
    portal, desc = args
    sfence()
    retry = enqcmd(portal, desc)
    return retry == 0, retry


@njit(nogil=True, cache=True)
def soft_push(args):
    """The software double's movdir64b / enqcmd (dsa/softqueue.py; its page's protocol there):
    retry while a shared queue has no free entry."""
    portal, desc = args
    while acquire_u8(portal + SOFT_DOORBELL) != 0:  # the device has not taken the last one yet
        pause()
    if load_u32(portal + SOFT_SHARED) != 0 and acquire_u32(portal + SOFT_CREDITS) == 0:
        return False, np.uint8(1)
    copy64(portal, desc)
    release_u8(portal + SOFT_DOORBELL, 1)
    return True, np.uint8(0)


# --- waits: poll one completion record's status byte ------------------------------------------
# Each is spin_until on a ready check of the record (args (comp, stamps)); the deadline is read
# every SPINS_PER_CHECK polls (a safety net: the device never wrote the record).


@njit(nogil=True, cache=True, inline="always")
def _read_status(comp, stamps):
    """One poll: the status byte; the read that sees it set is timed into stamps[1]."""
    t = tsc_end()
    status = acquire_u8(comp)
    if status != 0:
        stamps[1] = tsc_end() - t
    return status


@njit(nogil=True, cache=True, inline="always")
def status_set(args):
    """Ready when the record's status byte is set (its value)."""
    comp, stamps = args
    status = _read_status(comp, stamps)
    return status != 0, status


@njit(nogil=True, cache=True, inline="always")
def status_set_else_umwait(args):
    """As status_set; while unset, monitor the record's line and umwait (C0.1) for a write."""
    comp, stamps = args
    status = _read_status(comp, stamps)
    if status == 0:
        umonitor(comp)
        if acquire_u8(comp) == 0:  # re-check after arming, or a write in between is missed
            umwait(1, tsc_end() + np.uint64(UMWAIT_SLICE_TICKS))
    return status != 0, status


@njit(nogil=True, cache=True, inline="always")
def _poll(ready, relax, comp, timeout, stamps):
    """Poll until the status byte is set or `timeout` ticks pass. stamps[0] = polls, stamps[1] =
    ticks of the read that saw it. Returns the status, 0 = timed out."""
    why, status, spins = spin_until(ready, (comp, stamps), timeout, relax, never, ())
    if why != WAIT_READY:
        stamps[0] = spins
        return np.uint8(0)
    stamps[0] = spins + 1
    return status


@njit(nogil=True, cache=True)
def wait_spin(comp, timeout, stamps):
    """Spin on the status byte."""
    return _poll(status_set, False, comp, timeout, stamps)


@njit(nogil=True, cache=True)
def wait_pause(comp, timeout, stamps):
    """Spin with a pause between reads (yields the core's resources to its sibling)."""
    return _poll(status_set, True, comp, timeout, stamps)


@njit(nogil=True, cache=True)
def wait_umwait(comp, timeout, stamps):
    """Monitor the record's line and umwait (C0.1) until the device writes it. Needs waitpkg:
    compiled only when chosen, after the flag check."""
    return _poll(status_set_else_umwait, False, comp, timeout, stamps)


# --- the driver: submit, wait, settle (page-fault retry), time -----------------------------


@njit(nogil=True, cache=True)
def submit(push, portal, desc, timeout):
    """Push until accepted; returns the retries (enqcmd on a full shared WQ), or GAVE_UP when
    the queue stayed full for `timeout` ticks (counted from the SPINS_PER_CHECK-th retry: a
    queue that takes it sooner costs no clock read)."""
    why, _, retries = spin_until(push, (portal, desc), timeout, True, never, ())
    if why != WAIT_READY:
        return GAVE_UP
    return np.uint64(retries)


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
