"""The RPC slots' compiled client and server (rpc/slots.py has the ring's layout, its set-up and
the server process; the protocol is described there): post a request, await its response, serve
requests in ring order, and the two timed loops (round trip at queue depth 1, throughput at qd).
The word offsets and status codes below are the ring's, which these kernels and the Python side
share.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from nearlocal.kernels.intrinsics import tsc_begin, tsc_end
from nearlocal.kernels.spin import WAIT_EXPIRED, WAIT_READY, WAIT_STOPPED, never, spin_until
from nearlocal.rpc.kernels.sync import (
    WORDS_PER_LINE,
    flag_is,
    flag_set,
    invalidate,
    publish_flag,
    read_flag,
    write_data,
)

MAGIC = 0x4E4C52504331  # "NLRPC1"
HEADER_WORDS = 2 * WORDS_PER_LINE
# client line
W_MAGIC, W_SLOTS, W_MSG, W_PROTOCOL, W_STOP = 0, 1, 2, 3, 4
# server line
W_READY, W_SERVED, W_BAD = 8, 9, 10
RESPONSE_KEY = np.uint64(0xA5A5F00DCAFEBEEF)

OK, TIMEOUT, WRONG_BYTES, STOPPED, IDLE, DONE = 1, 0, -1, 2, 3, 4



@njit(cache=True, nogil=True, inline="always")
def request_word(seq, j):
    return (np.uint64(seq) * np.uint64(0x9E3779B97F4A7C15)) ^ np.uint64(j)


@njit(cache=True, nogil=True, inline="always")
def response_word(request):
    return ((request << np.uint64(17)) | (request >> np.uint64(47))) ^ RESPONSE_KEY


@njit(cache=True, nogil=True)
def post(raw, words, slots, msg_words, k, protocol):
    """Client: request k into slot k % slots, payload first, then its sequence in the flag."""
    slot_words = 2 * (WORDS_PER_LINE + (msg_words + WORDS_PER_LINE - 1) // WORDS_PER_LINE
                      * WORDS_PER_LINE)
    base = HEADER_WORDS + (k % slots) * slot_words
    seq = np.uint64(k + 1)
    for j in range(msg_words):
        write_data(words, base + WORDS_PER_LINE + j, request_word(seq, j), protocol)
    publish_flag(words, base, seq, protocol)


@njit(cache=True, nogil=True)
def await_response(raw, words, slots, msg_words, k, protocol, timeout_ticks):
    """Client: spin until request k's response is published, then check its bytes (the clock
    read only every SPINS_PER_CHECK spins: kernels/spin.py)."""
    slot_words = 2 * (WORDS_PER_LINE + (msg_words + WORDS_PER_LINE - 1) // WORDS_PER_LINE
                      * WORDS_PER_LINE)
    base = HEADER_WORDS + (k % slots) * slot_words
    flag = base + slot_words // 2
    seq = np.uint64(k + 1)
    why, _, _ = spin_until(flag_is, (raw, words, flag, protocol, seq), timeout_ticks, True,
                           never, ())
    if why != WAIT_READY:
        return TIMEOUT
    invalidate(raw, words, flag + WORDS_PER_LINE, msg_words, protocol)
    good = True
    for j in range(msg_words):
        if words[flag + WORDS_PER_LINE + j] != response_word(request_word(seq, j)):
            good = False
    return OK if good else WRONG_BYTES


@njit(cache=True, nogil=True)
def serve(raw, words, slots, msg_words, protocol, k, idle_ticks, max_requests):
    """Server: answer requests in ring order from request k on.

    Returns (next k, why): STOPPED when the client set the stop word, IDLE after idle_ticks with
    nothing to do (the caller checks its parent is alive and calls again), DONE after
    max_requests (0: no limit)."""
    slot_words = 2 * (WORDS_PER_LINE + (msg_words + WORDS_PER_LINE - 1) // WORDS_PER_LINE
                      * WORDS_PER_LINE)
    half = slot_words // 2
    served = 0
    bad = 0
    while True:
        base = HEADER_WORDS + (k % slots) * slot_words
        seq = np.uint64(k + 1)
        why, _, _ = spin_until(flag_is, (raw, words, base, protocol, seq), idle_ticks, True,
                               flag_set, (raw, words, W_STOP, protocol))
        if why == WAIT_STOPPED:
            return k, STOPPED
        if why == WAIT_EXPIRED:
            return k, IDLE
        invalidate(raw, words, base + WORDS_PER_LINE, msg_words, protocol)
        for j in range(msg_words):
            request = words[base + WORDS_PER_LINE + j]
            if request != request_word(seq, j):
                bad += 1
            write_data(words, base + half + WORDS_PER_LINE + j, response_word(request), protocol)
        publish_flag(words, base + half, seq, protocol)
        k += 1
        served += 1
        if bad:  # server-owned word, read by the client after the run
            publish_flag(words, W_BAD, read_flag(raw, words, W_BAD, protocol) + np.uint64(bad),
                         protocol)
            bad = 0
        if max_requests and served >= max_requests:
            return k, DONE


@njit(cache=True, nogil=True)
def time_roundtrip(raw, words, slots, msg_words, protocol, state, samples, timeout_ticks):
    """Queue depth 1: each sample is one request posted and its response checked, in TSC ticks.

    state[0] carries the next request number across calls. Returns OK, TIMEOUT or WRONG_BYTES."""
    for r in range(samples.size):
        k = state[0]
        t0 = tsc_begin()
        post(raw, words, slots, msg_words, k, protocol)
        status = await_response(raw, words, slots, msg_words, k, protocol, timeout_ticks)
        t1 = tsc_end()
        samples[r] = t1 - t0
        state[0] = k + 1
        if status != OK:
            return status
    return OK


@njit(cache=True, nogil=True)
def time_throughput(raw, words, slots, msg_words, protocol, state, qd, per_batch, samples,
                    timeout_ticks):
    """Up to qd requests in flight; each sample is the ticks of per_batch completions.

    The window stays full across batches; the requests still in flight at the end are drained
    outside the timing, so every call starts and ends with an empty ring."""
    posted = state[0]
    completed = posted
    for r in range(samples.size):
        target = completed + per_batch
        t0 = tsc_begin()
        while completed < target:
            while posted - completed < qd:
                post(raw, words, slots, msg_words, posted, protocol)
                posted += 1
            status = await_response(raw, words, slots, msg_words, completed, protocol,
                                    timeout_ticks)
            if status != OK:
                state[0] = posted
                return status
            completed += 1
        t1 = tsc_end()
        samples[r] = t1 - t0
    while completed < posted:
        status = await_response(raw, words, slots, msg_words, completed, protocol, timeout_ticks)
        if status != OK:
            state[0] = posted
            return status
        completed += 1
    state[0] = completed
    return OK
