"""The RDMA path of `nearlocal replay` without a NIC: the cut (columns swapped, parts past
max_qp_wr), the work requests laid out as build_chain lays them, and the compiled loop against a
provider made of ctypes callbacks that does what a READ does (copies the pool's bytes into the
SGEs)."""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest

from nearlocal.probe import verbs
from nearlocal.rdma.requests import (
    MOVER_ID_SHIFT,
    build_chain,
    build_parts,
    plan_replay,
    swap_columns,
)
from tests.test_rdma import POLL, POST


def _table(*requests):
    """A replay cut: each request a list of (pool offset, length), packed in its buffer."""
    rows, first = [], [0]
    for frags in requests:
        dst = 0
        for pool, length in frags:
            rows.append((pool, dst, length))
            dst += length
        first.append(len(rows))
    return np.array(rows, np.int64).reshape(-1, 3), np.array(first, np.int64)


def test_the_cut_swaps_columns_the_pool_is_the_remote_side():
    frags, first = _table([(8192, 100), (0, 200), (200, 50), (40960, 10)])
    swapped = swap_columns(frags)
    assert swapped[:, 0].tolist() == [0, 100, 300, 350]  # local: packed in rank 0's buffer
    assert swapped[:, 1].tolist() == [8192, 0, 200, 40960]  # remote: the pool, scattered
    _, wrs, part_first, parts = plan_replay(frags, first, 32, 0)
    # one READ per remote-contiguous run: 0+200 and 200+50 are one run of two SGEs
    assert wrs.tolist() == [[0, 1, 8192, 100], [1, 2, 0, 250], [3, 1, 40960, 10]]
    assert part_first.tolist() == [0, 3] and parts.tolist() == [0, 1]
    _, one, _, _ = plan_replay(frags, first, 1, 0)  # sge=one: a request per fragment
    assert len(one) == 4 and one[:, 2].tolist() == [8192, 0, 200, 40960]


def test_a_work_request_never_spans_two_requests_and_a_request_without_hits_has_no_part():
    frags, first = _table([(0, 64)], [], [(64, 64)])  # remote-contiguous across requests
    _, wrs, part_first, parts = plan_replay(frags, first, 32, 0)
    assert wrs[:, :2].tolist() == [[0, 1], [1, 1]]
    assert parts.tolist() == [0, 1, 1, 2] and part_first.tolist() == [0, 1, 2]


def test_a_request_past_max_qp_wr_is_split_into_parts():
    frags, first = _table([(i * 8192, 100) for i in range(7)], [(1 << 20, 10)])
    _, wrs, part_first, parts = plan_replay(frags, first, 32, 3)
    assert len(wrs) == 8
    assert np.diff(part_first).tolist() == [3, 3, 1, 1]
    assert parts.tolist() == [0, 3, 4]
    with pytest.raises(ValueError):
        plan_replay(frags, first, 32, -1)


def test_parts_are_laid_out_as_build_chain_lays_a_chain():
    frags, first = _table([(i * 8192, 100 + i) for i in range(5)])
    swapped, wrs, part_first, _ = plan_replay(frags, first, 1, 0)
    wr_buf, sge_buf = build_parts(swapped, wrs, part_first, 7, 1 << 30, 9)
    ref_wrs, ref_sges = build_chain(swapped, wrs, 0, 7, 1 << 30, 9, verbs.WR_RDMA_READ)
    assert bytes(sge_buf) == bytes(ref_sges)  # the SGEs' addresses are offsets until posted
    for i in range(len(wrs)):
        at = i * verbs.WR_BYTES
        mine = struct.unpack_from("QQQiiI", wr_buf, at), struct.unpack_from(
            "QI", wr_buf, at + verbs.WR_REMOTE_ADDR)
        theirs = struct.unpack_from("QQQiiI", ref_wrs, at), struct.unpack_from(
            "QI", ref_wrs, at + verbs.WR_REMOTE_ADDR)
        # the pointers differ by where each buffer lies; the rest is the same
        assert mine[0][0] == theirs[0][0] and mine[0][3:] == theirs[0][3:] and mine[1] == theirs[1]
        assert (mine[0][1] == 0) == (theirs[0][1] == 0)
        assert mine[0][2] - sge_buf.ctypes.data == theirs[0][2] - ref_sges.ctypes.data


def test_each_parts_last_request_is_signalled_and_ends_its_chain():
    frags, first = _table([(i * 8192, 100) for i in range(5)])
    swapped, wrs, part_first, _ = plan_replay(frags, first, 32, 2)
    wr_buf, _ = build_parts(swapped, wrs, part_first, 1, 0, 2)
    flags = [struct.unpack_from("I", wr_buf, i * verbs.WR_BYTES + verbs.WR_SEND_FLAGS)[0]
             for i in range(5)]
    nexts = [struct.unpack_from("Q", wr_buf, i * verbs.WR_BYTES + verbs.WR_NEXT)[0]
             for i in range(5)]
    assert flags == [0, verbs.SEND_SIGNALED, 0, verbs.SEND_SIGNALED, verbs.SEND_SIGNALED]
    assert [n == 0 for n in nexts] == [False, True, False, True, True]


class Reader:
    """post_send / poll_cq for G QPs on one CQ, doing what the READs do: each work request's
    remote range copied into its SGEs; the part's completion (its last wr_id) queued, completed
    newest first (the NIC need not finish QPs in posting order), one every `delay` polls."""

    def __init__(self, status: int = 0, wrong_id: bool = False, delay: int = 3):
        self.pending: list[int] = []
        self.posts: list[int] = []
        self.delay, self.polls = delay, 0
        self.status, self.wrong_id = status, wrong_id
        self.post = POST(self._post)
        self.poll = POLL(self._poll)

    def _post(self, qp, wr, bad):
        while True:
            sg_list = ctypes.c_uint64.from_address(wr + verbs.WR_SG_LIST).value
            count = ctypes.c_int32.from_address(wr + verbs.WR_NUM_SGE).value
            remote = ctypes.c_uint64.from_address(wr + verbs.WR_REMOTE_ADDR).value
            for k in range(count):
                addr, length, _ = struct.unpack(
                    "QII", ctypes.string_at(sg_list + k * verbs.SGE_BYTES, verbs.SGE_BYTES))
                ctypes.memmove(addr, remote, length)
                remote += length
            following = ctypes.c_uint64.from_address(wr + verbs.WR_NEXT).value
            if not following:
                break
            wr = following
        self.posts.append(qp)
        self.pending.append(ctypes.c_uint64.from_address(wr).value)
        return 0

    def _poll(self, cq, entries, wc):
        self.polls += 1
        if not self.pending or self.polls % self.delay:
            return 0
        wr_id = self.pending.pop()
        ctypes.c_uint64.from_address(wc).value = (99 << 32) if self.wrong_id else wr_id
        ctypes.c_uint32.from_address(wc + verbs.WC_STATUS).value = self.status
        return 1


def _replay(provider, frags, first, movers, max_wr=0, due=None, slot=1 << 16):
    from nearlocal.rdma import kernels

    pool = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8)
    buffers = np.zeros(movers * slot, np.uint8)
    swapped, wrs, part_first, parts = plan_replay(frags, first, 32, max_wr)
    wr_buf, sge_buf = build_parts(swapped, wrs, part_first, 1, pool.ctypes.data, 2)
    base, size = np.uint64(wr_buf.ctypes.data), np.uint64(verbs.WR_BYTES)
    heads = base + part_first[:-1].astype(np.uint64) * size
    tails = base + (part_first[1:].astype(np.uint64) - np.uint64(1)) * size
    n = len(first) - 1
    due = np.zeros(n, np.uint64) if due is None else due
    starts, ends = np.zeros(n, np.uint64), np.zeros(n, np.uint64)
    served = np.full(n, -7, np.int64)
    address = lambda f: np.uint64(ctypes.cast(f, ctypes.c_void_p).value)  # noqa: E731
    wc, bad = np.zeros(verbs.WC_BYTES, np.uint8), np.zeros(1, np.uint64)
    bases = np.array([buffers.ctypes.data + m * slot for m in range(movers)], np.uint64)
    why = kernels.replay_reads(
        address(provider.post), address(provider.poll),
        np.arange(100, 100 + movers, dtype=np.uint64), np.uint64(5),
        np.uint64(bad.ctypes.data), np.uint64(wc.ctypes.data), bases,
        np.uint64(sge_buf.ctypes.data), swapped[:, 0].astype(np.uint64), first, parts, heads,
        tails, MOVER_ID_SHIFT, due, starts, ends, served, np.uint64(1 << 40))
    return why, starts, ends, served, pool, buffers, swapped, part_first


def test_the_loop_reads_every_request_into_the_buffer_of_the_queue_pair_it_took():
    from nearlocal.rdma import kernels
    from nearlocal.rdma.replay import check_ranges

    rng = np.random.default_rng(1)
    requests = [[(int(o), 512) for o in rng.choice(2000, 9, replace=False) * 512]
                for _ in range(6)]
    requests.insert(2, [])  # a request without hits: nothing posted
    frags, first = _table(*requests)
    provider = Reader()
    why, starts, ends, served, pool, buffers, swapped, part_first = _replay(
        provider, frags, first, movers=2, max_wr=4)
    assert why == kernels.OK
    assert served[2] == -1 and starts[2] == ends[2]
    moved = [i for i in range(7) if i != 2]
    assert set(served[moved].tolist()) <= {0, 1} and (ends[moved] >= starts[moved]).all()
    assert len(provider.posts) == len(part_first) - 1  # every part posted once (9 WRs: 3 parts)
    assert set(provider.posts) == {100, 101} and not provider.pending
    ranges = check_ranges(swapped, first, served, 2)
    assert ranges and {q for q, *_ in ranges} == {0, 1}
    for q, dst, at, length in ranges:  # each QP's last request's bytes are the pool's
        assert np.array_equal(buffers[q * (1 << 16) + dst:][:length], pool[at:at + length])


def test_one_queue_pair_serves_in_arrival_order_each_after_the_last():
    from nearlocal.rdma import kernels

    frags, first = _table(*[[(i * 4096, 256)] for i in range(5)])
    why, starts, ends, served, *_ = _replay(Reader(), frags, first, movers=1)
    assert why == kernels.OK and served.tolist() == [0] * 5
    assert (starts[1:] >= ends[:-1]).all()  # a FIFO with one server: each waits for the last


def test_an_error_completion_or_a_wr_id_naming_no_busy_queue_pair_stops_the_loop():
    from nearlocal.rdma import kernels

    frags, first = _table([(0, 64)], [(4096, 64)])
    assert _replay(Reader(status=12), frags, first, movers=2)[0] == kernels.BAD_COMPLETION
    assert _replay(Reader(wrong_id=True), frags, first, movers=2)[0] == kernels.WRONG_MOVER


def test_the_check_reads_the_last_lap_of_a_request_that_wraps_its_buffer():
    from nearlocal.rdma.replay import check_ranges, last_lap

    assert last_lap(np.array([0, 100, 200, 0, 100])) == 3
    assert last_lap(np.array([0, 100])) == 0
    swapped = np.array([[0, 10, 5], [5, 20, 5], [0, 30, 5], [5, 40, 5]], np.int64)
    got = check_ranges(swapped, np.array([0, 4]), np.array([0]), 2)
    assert [(q, dst, pool) for q, dst, pool, _ in got] == [(0, 0, 30), (0, 5, 40)]
