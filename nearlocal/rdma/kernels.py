"""The timed loops of the rdma-* methods: compiled code that calls the provider's post_send,
post_recv and poll_cq through the function pointers in the device context (probe/verbs.py reads
them), with the work requests prebuilt in a numpy buffer (chained `next` pointers). Only posting
and polling sit inside a timed interval, between the same rdtscp-fenced TSC reads as every CPU
method.

Addresses (QP, CQ, WR chain, work completion, the RPC's slots) are plain uint64 arguments;
`post_send`, `post_recv` and `poll_cq` are called by an intrinsic that casts the address to the
C function's type. Memory the provider or the NIC writes (the work completion, a slot) is read by address
with atomic loads, never through a numpy array: numba marks array arguments `noalias`, so LLVM
may assume an opaque call does not change them and keep a value read before it.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from nearlocal.kernels.intrinsics import tsc_begin, tsc_end
from nearlocal.kernels.spin import WAIT_EXPIRED, WAIT_READY, never, spin_until

OK, POST_FAILED, POLL_FAILED, BAD_COMPLETION, TIMEOUT, STOPPED, IDLE = 0, 1, 2, 3, 4, 5, 6
RECV_POST_FAILED, WRONG_REPLY = 7, 8  # the send/recv RPC's: ibv_post_recv failed; a reply's
# sequence word is not its request's
WRONG_MOVER = 9  # movers=k: a completion's wr_id names no mover of the repetition
WC_WR_ID, WC_STATUS = 0, 8  # ibv_wc.wr_id, ibv_wc.status (verbs.WC_WR_ID, verbs.WC_STATUS)
STOP = np.uint64(0xFFFFFFFFFFFFFFFF)  # the RPC's last sequence: the server returns
NEVER = np.uint64(0xFFFFFFFFFFFFFFFF)  # a TSC reading no wait reaches: no deadline, no arrival
ARRIVED = 2  # replay_reads' wait: the next request's arrival (a poll gives 1, or < 0)


def _post_call(doc: str):
    """An intrinsic calling `int fn(struct ibv_qp *, WR *, WR **)` at the address `fn`: the
    shape of both post_send and post_recv."""
    @intrinsic
    def post(typingctx, fn, qp, wr, bad):
        if not all(isinstance(t, types.Integer) for t in (fn, qp, wr, bad)):
            return None

        def codegen(context, builder, signature, args):
            i8p = ir.IntType(8).as_pointer()
            fnty = ir.FunctionType(ir.IntType(32), [i8p, i8p, i8p])
            target = builder.inttoptr(args[0], fnty.as_pointer())
            return builder.call(target, [builder.inttoptr(a, i8p) for a in args[1:]])

        return types.int32(fn, qp, wr, bad), codegen

    post.__doc__ = doc
    return post


_post_send = _post_call("int post_send(struct ibv_qp *, struct ibv_send_wr *, "
                        "struct ibv_send_wr **)")
_post_recv = _post_call("int post_recv(struct ibv_qp *, struct ibv_recv_wr *, "
                        "struct ibv_recv_wr **)")


@intrinsic
def _poll_cq(typingctx, fn, cq, entries, wc):
    """int poll_cq(struct ibv_cq *, int num_entries, struct ibv_wc *)"""
    if not all(isinstance(t, types.Integer) for t in (fn, cq, entries, wc)):
        return None

    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(i32, [i8p, i32, i8p])
        target = builder.inttoptr(args[0], fnty.as_pointer())
        count = builder.trunc(args[2], i32) if args[2].type.width > 32 else args[2]
        return builder.call(target, [builder.inttoptr(args[1], i8p), count,
                                     builder.inttoptr(args[3], i8p)])

    return types.int32(fn, cq, entries, wc), codegen


def _address_load(bits: int):
    @intrinsic
    def load(typingctx, address):
        """`load atomic acquire` of a uint at an address (memory another agent writes)."""
        if not isinstance(address, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            ptr = builder.inttoptr(args[0], ir.IntType(bits).as_pointer())
            value = builder.load_atomic(ptr, "acquire", bits // 8)
            return builder.zext(value, ir.IntType(64)) if bits < 64 else value

        return types.uint64(address), codegen

    return load


_load_u32 = _address_load(32)
_load_u64 = _address_load(64)


@intrinsic
def _store_u64(typingctx, address, value):
    """`store atomic release` of a uint64 at an address (memory the provider or NIC reads)."""
    if not (isinstance(address, types.Integer) and isinstance(value, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        value = context.cast(builder, args[1], signature.args[1], types.uint64)
        builder.store_atomic(value, ptr, "release", 8)
        return context.get_dummy_value()

    return types.void(address, value), codegen


# The ready checks of the waits (kernels/spin.py's spin_until), args in one tuple.


@njit(cache=True, nogil=True, inline="always")
def _polled(args):
    """Ready when a poll of the CQ gives a completion (1) or fails (< 0): args (poll_cq, cq,
    wc_addr)."""
    poll_cq, cq, wc_addr = args
    n = _poll_cq(poll_cq, cq, 1, wc_addr)
    return n != 0, n


@njit(cache=True, nogil=True, inline="always")
def _word_is(args):
    """Ready when the uint64 at `address` (the NIC writes it) holds `want`: args (address,
    want)."""
    address, want = args
    value = _load_u64(address)
    return value == want, value


@njit(cache=True, nogil=True, inline="always")
def _word_moved(args):
    """Ready when the uint64 at `address` no longer holds `old` (the value it holds then)."""
    address, old = args
    value = _load_u64(address)
    return value != old, value


@njit(cache=True, nogil=True, inline="always")
def _next_event(args):
    """A replay's wait: a completion (1) or a failed poll (< 0), else ARRIVED once the clock
    reaches `due` (NEVER: only a completion will do). args (poll_cq, cq, wc_addr, due)."""
    poll_cq, cq, wc_addr, due = args
    got = np.int64(_poll_cq(poll_cq, cq, 1, wc_addr))
    if got != 0:
        return True, got
    if due != NEVER and tsc_end() >= due:
        return True, np.int64(ARRIVED)
    return False, got


@njit(cache=True, nogil=True, inline="always")
def _complete(poll_cq, cq, wc_addr, timeout_ticks):
    """Poll until a completion arrives; OK, or why not."""
    why, n, _ = spin_until(_polled, (poll_cq, cq, wc_addr), timeout_ticks, False, never, ())
    if why != WAIT_READY:
        return TIMEOUT
    if n < 0:
        return POLL_FAILED
    if _load_u32(wc_addr + WC_STATUS) != 0:
        return BAD_COMPLETION
    return OK


@njit(cache=True, nogil=True)
def post_to_completion(post_send, poll_cq, qp, cq, wr_head, bad_addr, wc_addr, samples,
                       timeout_ticks):
    """Each sample: the pattern's whole WR chain posted (one call), its last (signalled) WR's
    completion polled. RC completes in order, so that completion is the whole transfer's."""
    for s in range(samples.size):
        t0 = tsc_begin()
        if _post_send(post_send, qp, wr_head, bad_addr) != 0:
            return POST_FAILED
        why = _complete(poll_cq, cq, wc_addr, timeout_ticks)
        t1 = tsc_end()
        if why != OK:
            return why
        samples[s] = t1 - t0
    return OK


@njit(cache=True, nogil=True)
def movers_to_completion(post_send, poll_cq, qps, cq, heads, bad_addr, wc_addr, id_shift,
                         starts, ends, timeout_ticks):
    """movers=k: each repetition, k transfers at once, one per queue pair. Mover m's whole WR
    chain (`heads[m]`) is posted on its own QP (`qps[m]`), all k back to back, each post
    preceded by a reading of the clock (`starts[m, s]`); then the CQ the k QPs share is polled
    and each completion (its wr_id >> id_shift: the mover) stamps that mover's end
    (`ends[m, s]`). One thread posts and polls: the k transfers share the NIC and the link, not
    the CPU's posting threads."""
    k = qps.size
    for s in range(starts.shape[1]):
        for m in range(k):
            starts[m, s] = tsc_begin()
            if _post_send(post_send, qps[m], heads[m], bad_addr) != 0:
                return POST_FAILED
        for _done in range(k):
            why = _complete(poll_cq, cq, wc_addr, timeout_ticks)
            stamp = tsc_end()  # as post_to_completion's t1: after the completion's checks
            if why != OK:
                return why
            mover = _load_u64(wc_addr + WC_WR_ID) >> np.uint64(id_shift)
            if mover >= np.uint64(k):
                return WRONG_MOVER
            ends[mover, s] = stamp
    return OK


@njit(cache=True, nogil=True)
def pipelined(post_send, poll_cq, qp, cq, wr_head, bad_addr, wc_addr, window, transfers,
              samples, timeout_ticks):
    """Each sample: `transfers` transfers with up to `window` in flight (a new one posted as each
    completes): ticks for all of them. Divided by `transfers`, a transfer's time once the
    pipeline is full: the bytes' time on the path, without the per-transfer synchronisation."""
    for s in range(samples.size):
        t0 = tsc_begin()
        posted = 0
        while posted < window and posted < transfers:
            if _post_send(post_send, qp, wr_head, bad_addr) != 0:
                return POST_FAILED
            posted += 1
        for _ in range(transfers):
            why = _complete(poll_cq, cq, wc_addr, timeout_ticks)
            if why != OK:
                return why
            if posted < transfers:
                if _post_send(post_send, qp, wr_head, bad_addr) != 0:
                    return POST_FAILED
                posted += 1
        t1 = tsc_end()
        samples[s] = t1 - t0
    return OK


@njit(cache=True, nogil=True)
def rpc_client(post_send, poll_cq, qp, cq, wr_head, bad_addr, wc_addr, request_seq, reply_seq,
               first_seq, samples, timeout_ticks):
    """Each sample: the request's sequence word set (untimed), then RDMA write of the request
    into the server's slot -> the reply's sequence word seen in this rank's reply slot (written
    there by the server's RDMA write). The send completion is reaped after the clock stops.
    request_seq / reply_seq: the addresses of the two sequence words."""
    for s in range(samples.size):
        seq = np.uint64(first_seq + s)
        _store_u64(request_seq, seq)
        t0 = tsc_begin()
        if _post_send(post_send, qp, wr_head, bad_addr) != 0:
            return POST_FAILED
        why, _, _ = spin_until(_word_is, (reply_seq, seq), timeout_ticks, True, never, ())
        t1 = tsc_end()
        if why != WAIT_READY:
            return TIMEOUT
        samples[s] = t1 - t0
        why = _complete(poll_cq, cq, wc_addr, timeout_ticks)
        if why != OK:
            return why
    return OK


@njit(cache=True, nogil=True, inline="always")
def _echo(slot, reply, words, seq):
    """The RPC's handler: the request (at address `slot`, `words` uint64 words) copied into the
    reply buffer, its sequence word `seq` last."""
    for w in range(words - 1):
        _store_u64(reply + 8 * w, _load_u64(slot + 8 * w))
    _store_u64(reply + 8 * (words - 1), seq)


@njit(cache=True, nogil=True)
def rpc_server(post_send, poll_cq, qp, cq, wr_head, bad_addr, wc_addr, slot, reply, words,
               state, timeout_ticks, idle_ticks):
    """Serve requests: a new sequence (the slot's last word) -> the request copied into the
    reply buffer (the handler: an echo), its sequence word last -> RDMA write of the reply into
    the client's slot. Returns STOPPED (sequence STOP), IDLE (no request for idle_ticks: the
    caller checks its deadline and calls again), or an error. slot / reply: addresses of
    `words` uint64 words. state[0]: the last sequence served; state[1]: requests served."""
    last = 8 * (words - 1)
    while True:
        why, seq, _ = spin_until(_word_moved, (slot + last, np.uint64(state[0])), idle_ticks,
                                 True, never, ())
        if why == WAIT_EXPIRED:
            return IDLE
        if seq == STOP:
            return STOPPED
        _echo(slot, reply, words, seq)
        if _post_send(post_send, qp, wr_head, bad_addr) != 0:
            return POST_FAILED
        why = _complete(poll_cq, cq, wc_addr, timeout_ticks)
        if why != OK:
            return why
        state[0] = np.int64(seq)
        state[1] += 1


# --- the send/recv RPC (transport=send): two-sided, B15's RDMA RC RPC -------------------------
# The QP has a receive CQ of its own: the timed interval polls it for the reply alone, and the
# request's send completion (its ACK, whose arrival relative to the reply no one orders) is
# reaped from the send CQ after the clock stops. One CQ would put that completion inside the
# interval whenever it came first.


@njit(cache=True, nogil=True)
def rpc_send_client(post_send, post_recv, poll_cq, qp, send_cq, recv_cq, send_wr, recv_wr,
                    bad_addr, wc_addr, request_seq, reply_seq, first_seq, samples,
                    timeout_ticks):
    """Each sample: the request's sequence word set and the reply's receive posted (untimed:
    the reply never meets an empty receive queue), then ibv_post_send of a SEND of the request
    -> the reply's receive completion polled on the receive CQ. After the clock stops: the
    reply's sequence word checked against the request's, the send completion reaped."""
    for s in range(samples.size):
        seq = np.uint64(first_seq + s)
        _store_u64(request_seq, seq)
        if _post_recv(post_recv, qp, recv_wr, bad_addr) != 0:
            return RECV_POST_FAILED
        t0 = tsc_begin()
        if _post_send(post_send, qp, send_wr, bad_addr) != 0:
            return POST_FAILED
        why = _complete(poll_cq, recv_cq, wc_addr, timeout_ticks)
        t1 = tsc_end()
        if why != OK:
            return why
        samples[s] = t1 - t0
        if _load_u64(reply_seq) != seq:
            return WRONG_REPLY
        why = _complete(poll_cq, send_cq, wc_addr, timeout_ticks)
        if why != OK:
            return why
    return OK


@njit(cache=True, nogil=True)
def rpc_send_server(post_send, post_recv, poll_cq, qp, send_cq, recv_cq, send_wr, recv_wr,
                    bad_addr, wc_addr, slot, reply, words, state, timeout_ticks, idle_ticks):
    """Serve requests with a receive always posted into `slot` (the caller posts the first):
    the receive completion polled -> the request copied into the reply buffer (an echo), the
    receive re-posted, then a SEND of the reply, its send completion reaped. The receive is
    re-posted before the reply goes out, so the client's next request (sent only once it has
    the reply) always finds one: no RNR wait. Returns STOPPED (sequence STOP, not answered),
    IDLE (no request for idle_ticks: the caller checks its deadline and calls again, the
    receive still posted), or an error. state[0]: the last sequence served; state[1]: requests
    served."""
    last = 8 * (words - 1)
    while True:
        why, n, _ = spin_until(_polled, (poll_cq, recv_cq, wc_addr), idle_ticks, True, never, ())
        if why == WAIT_EXPIRED:
            return IDLE
        if n < 0:
            return POLL_FAILED
        if _load_u32(wc_addr + WC_STATUS) != 0:
            return BAD_COMPLETION
        seq = _load_u64(slot + last)
        if seq == STOP:
            return STOPPED
        _echo(slot, reply, words, seq)
        if _post_recv(post_recv, qp, recv_wr, bad_addr) != 0:
            return RECV_POST_FAILED
        if _post_send(post_send, qp, send_wr, bad_addr) != 0:
            return POST_FAILED
        why = _complete(poll_cq, send_cq, wc_addr, timeout_ticks)
        if why != OK:
            return why
        state[0] = np.int64(seq)
        state[1] += 1


# --- a replay's reads (`nearlocal replay --method rdma-read`) -------------------------------


@njit(cache=True, nogil=True)
def replay_reads(post_send, poll_cq, qps, cq, bad_addr, wc_addr, bases, sge_base, dst_off,
                 request_frags, request_parts, heads, tails, id_shift, due, starts, ends,
                 served, timeout_ticks):
    """The RDMA form of kernels/movers.replay_mover: G queue pairs (`qps`) on one CQ are the
    movers, one thread posts and polls. Requests are taken in arrival order: spin on the TSC to
    request i's arrival `due[i]` (polling the CQ meanwhile, so a completion is stamped when it
    comes); take a free QP q (all G busy: poll until one frees, the queue's wait); point its
    SGEs at q's own buffer (`bases[q]` + `dst_off[k]`, SGE k at `sge_base` + 16 k) and write
    each of its parts' wr_id (q << id_shift | part) into the part's signalled last request
    (`tails[p]`, by address); read the clock (`starts[i]`) and post its first part (`heads[p]`).
    A completion's wr_id names its QP: the request's next part is posted on it, or, after its
    last, the clock read at the completion is its end (`ends[i]`) and q is free. A request
    without parts (no hit) starts and ends when it is taken. `served[i]`: its QP (-1: none).
    Returns OK, or why not (a post or poll failure, an error completion, a wr_id naming no busy
    QP, no completion within `timeout_ticks` while one is due)."""
    g = qps.size
    n = due.size
    busy = np.full(g, -1, np.int64)
    part = np.zeros(g, np.int64)
    in_flight = 0
    i = 0
    mask = (np.uint64(1) << np.uint64(id_shift)) - np.uint64(1)
    while i < n or in_flight > 0:
        # request i can be taken once due: a QP is free, or it has nothing to move
        takes = i < n and (in_flight < g or request_parts[i] == request_parts[i + 1])
        why, got, _ = spin_until(_next_event, (poll_cq, cq, wc_addr, due[i] if takes else NEVER),
                                 np.uint64(timeout_ticks) if in_flight > 0 else NEVER,
                                 in_flight == 0, never, ())
        if why != WAIT_READY:
            return TIMEOUT
        if got < 0:
            return POLL_FAILED
        if got == 1:
            stamp = tsc_end()
            if _load_u32(wc_addr + WC_STATUS) != 0:
                return BAD_COMPLETION
            wr_id = _load_u64(wc_addr + WC_WR_ID)
            q = np.int64(wr_id >> np.uint64(id_shift))
            if q >= g or busy[q] < 0 or np.int64(wr_id & mask) != part[q]:
                return WRONG_MOVER
            r = busy[q]
            p = part[q] + 1
            if p < request_parts[r + 1]:
                part[q] = p
                if _post_send(post_send, qps[q], heads[p], bad_addr) != 0:
                    return POST_FAILED
            else:
                ends[r] = stamp
                busy[q] = -1
                in_flight -= 1
            continue
        lo, hi = request_parts[i], request_parts[i + 1]  # ARRIVED: request i is due
        if lo == hi:  # no hit: nothing to move
            stamp = tsc_end()
            starts[i] = stamp
            ends[i] = stamp
            served[i] = -1
            i += 1
            continue
        q = 0
        while busy[q] >= 0:  # `takes`: one is free
            q += 1
        base = bases[q]
        for k in range(request_frags[i], request_frags[i + 1]):
            _store_u64(sge_base + np.uint64(16 * k), base + dst_off[k])
        for p in range(lo, hi):
            _store_u64(tails[p], (np.uint64(q) << np.uint64(id_shift)) | np.uint64(p))
        busy[q] = i
        part[q] = lo
        served[i] = q
        starts[i] = tsc_begin()
        if _post_send(post_send, qps[q], heads[lo], bad_addr) != 0:
            return POST_FAILED
        in_flight += 1
        i += 1
    return OK
