"""Compiled loops of the handoff between hosts: a writer publishes a batch of records (the
record store of rpc/records.py, its seqlock and checksum) and announces it; every reader looks
each record up (header: sequence, version, checksum), copies it, checks it and acknowledges.
The writer times announce -> every acknowledgement on its own clock (one clock: the hosts' TSCs
are not comparable). The control words follow rpc/kernels/sync.py's protocols, like the records.

Control area (uint64 words; each line written by one agent):
    line 0      writer: announced version, stop, mode (1: flag only, no records)
    line 1 + r  reader r: acknowledged version, records refused
"""

from __future__ import annotations

import numpy as np
from numba import njit

from nearlocal.kernels.intrinsics import tsc_begin, tsc_end
from nearlocal.kernels.spin import WAIT_EXPIRED, WAIT_READY, WAIT_STOPPED, never, spin_until
from nearlocal.rpc.kernels import records as rec
from nearlocal.rpc.kernels.sync import (
    WORDS_PER_LINE,
    flag_is,
    flag_moved,
    flag_set,
    publish_flag,
    read_flag,
    write_data,
)

A_VERSION, A_STOP, A_MODE = 0, 1, 2
R_ACK, R_REFUSED = 0, 1
CONTROL_BYTES = 4096  # the record store starts after it
OK, TIMEOUT, STOPPED, IDLE = 1, 0, 2, 3


def control_words(readers: int) -> int:
    return (1 + readers) * WORDS_PER_LINE


@njit(cache=True, nogil=True)
def _await_acks(raw, words, readers, version, protocol, timeout_ticks):
    for r in range(readers):
        ack = (1 + r) * WORDS_PER_LINE + R_ACK
        why, _, _ = spin_until(flag_is, (raw, words, ack, protocol, version), timeout_ticks,
                               True, never, ())
        if why != WAIT_READY:
            return False
    return True


@njit(cache=True, nogil=True)
def handoff_write(raw, words, sraw, swords, records, readers, state, flag_only, samples, protocol,
                  timeout_ticks):
    """Each sample: (unless flag_only) every record rewritten at a new version, untimed; then
    announce -> every reader's acknowledgement, in ticks. state[0]: the last version used."""
    for s in range(samples.size):
        version = np.uint64(state[0] + 1)
        state[0] += 1
        if not flag_only:
            for index in range(records):
                rec.write_record(sraw, swords, index, version, 0, protocol)
        write_data(words, A_MODE, np.uint64(1 if flag_only else 0), protocol)
        t0 = tsc_begin()
        publish_flag(words, A_VERSION, version, protocol)
        good = _await_acks(raw, words, readers, version, protocol, timeout_ticks)
        t1 = tsc_end()
        samples[s] = t1 - t0
        if not good:
            return TIMEOUT
    return OK


@njit(cache=True, nogil=True)
def handoff_read(raw, words, sraw, swords, records, reader, area, local, monitor, state, protocol,
                 timeout_ticks, idle_ticks):
    """A reader: for every announced version, look up, copy and check every record (unless the
    announcement is flag only), then acknowledge. Returns STOPPED (the writer's stop word) or
    IDLE (nothing announced for idle_ticks: the caller checks its deadline and calls again).
    state[0]: the last version handled; state[1]: records refused (not whole or not the
    announced version: never expected, counted for the row)."""
    line = (1 + reader) * WORDS_PER_LINE
    while True:
        why, version, _ = spin_until(flag_moved,
                                     (raw, words, A_VERSION, protocol, np.uint64(state[0])),
                                     idle_ticks, True, flag_set, (raw, words, A_STOP, protocol))
        if why == WAIT_STOPPED:
            return STOPPED
        if why == WAIT_EXPIRED:
            return IDLE
        if read_flag(raw, words, A_MODE, protocol) == 0:
            for index in range(records):
                outcome, got = rec.read_record(sraw, swords, index, local, monitor, area,
                                               timeout_ticks, protocol, True)
                if outcome != rec.READ_OK or got != version:
                    state[1] += 1
        state[0] = np.int64(version)
        publish_flag(words, line + R_REFUSED, np.uint64(state[1]), protocol)
        publish_flag(words, line + R_ACK, version, protocol)
