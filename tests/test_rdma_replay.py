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


def test_the_check_takes_only_fragments_no_later_one_overwrote():
    from nearlocal.rdma.replay import check_ranges, intact

    # a buffer of 100 B, fragments of 30 packed at 0, 30, 60, 90 (straddles: at 0), 120 (at 20)
    dst = np.array([0, 30, 60, 0, 20])
    length = np.full(5, 30)
    assert [intact(dst, length, k) for k in range(5)] == [False, False, True, False, True]
    swapped = np.stack([dst, np.arange(5) * 1000, length], axis=1)
    got = check_ranges(swapped, np.array([0, 5]), np.array([1]), 2)
    assert [(q, d, pool) for q, d, pool, _ in got] == [(1, 60, 2000), (1, 20, 4000)]


# --- the command: bad input, and both ranks' parts with a fake world and a fake link ---------


@pytest.mark.parametrize("argv, words", [
    (["--method", "rdma-read"], "mpiexec -n 2 nearlocal replay --method rdma-read"),
    (["--method", "nosuch"], "--method nosuch"),
    (["--param", "sge=one"], "only --method rdma-read takes parameters"),
])
def test_the_rdma_replays_bad_input_is_one_line_exit_2(tmp_path, capsys, monkeypatch, argv,
                                                         words):
    from nearlocal.frontends.cli import main
    from tests.test_replay import _trace

    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS",
                 "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(name, raising=False)
    trace = _trace(tmp_path, [{"timestamp": 0, "input_length": 10, "output_length": 1,
                               "hash_ids": [1]}])
    assert main(["replay", "--trace", trace, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


def test_the_rdma_replays_params_and_queue_pairs_are_checked():
    from nearlocal.errors import UsageError
    from nearlocal.rdma.replay import check_movers, check_params

    assert check_params(["sge=one", "mtu=4096"]) == {"sge": "one", "device": "", "mtu": "4096"}
    for bad, words in ((["sge=many"], "sge=many"), (["mtu=999"], "mtu=999"),
                       (["movers=2"], "takes sge, device, mtu"), (["sge"], "KEY=VALUE")):
        with pytest.raises(UsageError, match=words):
            check_params(bad)
    with pytest.raises(UsageError, match="queue pairs"):
        check_movers(0)


class FakeWorld:
    """Two ranks' World in one process: a queue per rank."""

    def __init__(self, rank: int, boxes):
        self.rank, self.size, self.boxes = rank, 2, boxes

    def send(self, obj, dest, timeout_s, what=""):
        self.boxes[dest].put(obj)

    def recv(self, source, timeout_s, what=""):
        return self.boxes[self.rank].get(timeout=min(timeout_s, 60))


def test_both_ranks_replay_through_a_fake_link(tmp_path, monkeypatch):
    """Rank 1 lays out and fills the pool and answers the check; rank 0 cuts, connects G = 2
    queue pairs, replays by the compiled loop (the provider reads rank 1's pool) and reports
    wait, transfer and the data check as the host replay does."""
    import json
    import queue
    import threading
    from types import SimpleNamespace

    from nearlocal.frontends.cli import main
    from nearlocal.rack import mpi
    from nearlocal.rdma import replay as rdma_replay
    from tests.test_replay import _small_llc, _three_requests

    _small_llc(monkeypatch)
    reader, pool_at, registered = Reader(), {}, threading.Event()
    address = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731

    class Link:
        def __init__(self, site, max_send_wr, max_sge, queue_pairs=1):
            if site.rank == 1:
                pool_at["addr"] = site.pool.array.ctypes.data
                registered.set()
            else:
                assert registered.wait(30)
                assert max_send_wr <= 8 and max_sge <= 4  # the device's limits
            self.qps = [SimpleNamespace(qp=100 + m, qp_num=7 + m, post_send=address(reader.post),
                                        poll_cq=address(reader.poll), cq=5, lkey=1)
                        for m in range(queue_pairs)]
            self.qp = self.qps[0]
            self.peer = SimpleNamespace(addr=pool_at.get("addr", 0), rkey=2)
            self.bad, self.wc = np.zeros(1, np.uint64), np.zeros(verbs.WC_BYTES, np.uint8)

        def facts(self):
            return {"device": "fake0", "path_mtu": 1024}

        def close(self):
            pass

    monkeypatch.setattr(rdma_replay, "_Link", Link)
    monkeypatch.setattr(rdma_replay, "device_limits",
                        lambda params: ("fake0", {"max_sge_rd": 4, "max_qp_wr": 8}))
    boxes = [queue.Queue(), queue.Queue()]
    rank1 = {}
    server = threading.Thread(target=lambda: rank1.setdefault(
        "rc", rdma_replay.serve(FakeWorld(1, boxes), lambda region: "")))
    server.start()
    monkeypatch.setattr(mpi, "in_mpi_job", lambda: True)
    monkeypatch.setattr(mpi, "world", lambda: FakeWorld(0, boxes))
    out = tmp_path / "replay.json"
    try:
        rc = main(["replay", "--method", "rdma-read", "--movers", "2", "--trace",
                   _three_requests(tmp_path), "--layers", "0-1", "--seconds", "1",
                   "--out", str(out)])
    finally:
        server.join(60)
    data = json.loads(out.read_text())
    assert (rc, rank1["rc"]) == (0, 0), data.get("data_check")
    assert data["method"] == "rdma-read" and data["path"].startswith("rdma (rdma-read")
    assert data["requests"] == 3 and data["requests_with_hits"] == 2
    assert data["per_request"][0]["mover"] == -1  # no hit: no queue pair
    assert all(r["transfer_ns"] >= 0 and r["wait_ns"] >= 0 for r in data["per_request"])
    assert data["data_check"].startswith("ok: ") and data["rdma"]["sge_limit"] == 4
    assert [q["qp"] for q in data["rdma"]["queue_pairs"]] == [0, 1]
    assert "queue pairs" in data["timed"] and data["reload"]["p50_ns"] > 0
