"""A pattern as RDMA work requests: split by the device's real scatter-gather limit, built once
as a chain of `ibv_send_wr` in a numpy buffer (the timed loop only posts and polls it).

The local side holds the pattern's pieces where the pattern puts them in the region (column 0
of `Pattern.frags`: a KV block's 128 pieces, 1024 records at their stride); the remote side
receives them packed (column 1), as a transfer into a peer's buffer does. One work request
carries up to `sge_limit` local pieces into one contiguous remote range, so a request ends where
the limit is reached or the remote offsets stop being contiguous.
"""

from __future__ import annotations

import struct

import numpy as np

from nearlocal.probe import verbs

SGE_VARIANTS = ("one", "batched")  # one request per fragment (baseline), SGE-batched (best case)


MOVER_ID_SHIFT = 32  # movers=k: a work request's wr_id >> 32 is its mover (its queue pair)


def plan_requests(frags: np.ndarray, sge_limit: int) -> np.ndarray:
    """Rows (first fragment, fragments, remote offset, bytes): the work requests of one sample.
    `sge_limit` 1 is the one-request-per-fragment baseline."""
    if sge_limit < 1:
        raise ValueError(f"sge_limit {sge_limit} < 1")
    rows = []
    first = 0
    count = len(frags)
    while first < count:
        end = first + 1
        while (end < count and end - first < sge_limit
               and frags[end, 1] == frags[end - 1, 1] + frags[end - 1, 2]):
            end += 1
        rows.append((first, end - first, int(frags[first, 1]),
                     int(frags[first:end, 2].sum())))
        first = end
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


def sge_limit(variant: str, limits: dict, opcode: int) -> int:
    """SGEs per request: 1 for `one`, the device's max_sge (max_sge_rd for reads) for `batched`."""
    if variant == "one":
        return 1
    key = "max_sge_rd" if opcode == verbs.WR_RDMA_READ else "max_sge"
    return max(1, int(limits.get(key) or limits.get("max_sge") or 1))


def build_chain(frags: np.ndarray, plan: np.ndarray, local_addr: int, lkey: int,
                remote_addr: int, rkey: int, opcode: int,
                first_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(work requests, scatter-gather entries): numpy byte buffers holding `ibv_send_wr`s chained
    by `next` and their `ibv_sge`s. Only the last request is signalled (RC completes in order).
    Request i's wr_id is `first_id` + i (movers=k: mover m's chain starts at m << MOVER_ID_SHIFT,
    so the completion's wr_id names its mover). Both buffers must stay alive while they are
    posted (their addresses are in each other)."""
    wrs = np.zeros(len(plan) * verbs.WR_BYTES, np.uint8)
    sges = np.zeros(max(len(frags), 1) * verbs.SGE_BYTES, np.uint8)
    wr_base, sge_base = wrs.ctypes.data, sges.ctypes.data
    for k in range(len(frags)):
        struct.pack_into("QII", sges, k * verbs.SGE_BYTES, local_addr + int(frags[k, 0]),
                         int(frags[k, 2]), lkey)
    for index, (first, count, remote_offset, _) in enumerate(plan):
        at = index * verbs.WR_BYTES
        last = index == len(plan) - 1
        struct.pack_into("QQQiiI", wrs, at, first_id + index, 0 if last else wr_base + at + verbs.WR_BYTES,
                         sge_base + int(first) * verbs.SGE_BYTES, int(count), opcode,
                         verbs.SEND_SIGNALED if last else 0)
        struct.pack_into("QI", wrs, at + verbs.WR_REMOTE_ADDR, remote_addr + int(remote_offset),
                         rkey)
    return wrs, sges


def build_recv(local_addr: int, length: int, lkey: int) -> tuple[np.ndarray, np.ndarray]:
    """(receive request, its scatter-gather entry): one `ibv_recv_wr` (next NULL) taking a
    message of up to `length` bytes at `local_addr`. Both buffers must stay alive while it is
    posted."""
    wr = np.zeros(verbs.RECV_WR_BYTES, np.uint8)
    sge = np.zeros(verbs.SGE_BYTES, np.uint8)
    struct.pack_into("QII", sge, 0, local_addr, length, lkey)
    struct.pack_into("QQQi", wr, 0, 0, 0, sge.ctypes.data, 1)
    return wr, sge


# --- a replay's reads (`nearlocal replay --method rdma-read`): the opposite cut ---------------
# rdma-read's pieces are scattered on the local side and packed on the remote one. A replay's
# reload is the other way round: the pool's fragments lie scattered on rank 1 (column 0 of the
# replay's fragment table, pool offsets) and land packed in rank 0's buffer (column 1). So the
# columns are swapped before plan_requests: the remote side is the pool, one READ per run of
# remote-contiguous fragments (about one work request per fragment), and the local pieces (the
# destination, usually one per request) are its SGEs.

REPLAY_ID_MASK = (1 << MOVER_ID_SHIFT) - 1  # a part's wr_id: QP << MOVER_ID_SHIFT | part


def swap_columns(frags: np.ndarray) -> np.ndarray:
    """A replay's (pool offset, destination offset, length) table as plan_requests' (local,
    remote, length): local = the destination, remote = the pool."""
    return np.ascontiguousarray(np.asarray(frags, np.int64)[:, [1, 0, 2]])


def plan_replay(frags: np.ndarray, first: np.ndarray, sge_limit: int, max_wr: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every request's reads: (swapped fragments, work requests, part_first, request_parts).

    Work requests are plan_requests' rows over the swapped table, each request planned on its
    own (a work request never spans two), with their first fragment's index global. A request
    needing more than `max_wr` (the device's max_qp_wr; 0: no limit) is split into parts of at
    most `max_wr` each, posted one after the other on its queue pair (the next when the last
    one's signalled completion arrives). Part p is work requests part_first[p] .. [p + 1];
    request i's parts are request_parts[i] .. [i + 1] (none: no hit, nothing to move)."""
    if max_wr < 0:
        raise ValueError(f"max_wr {max_wr} < 0")
    swapped = swap_columns(frags) if len(frags) else np.zeros((0, 3), np.int64)
    rows, part_first, request_parts = [], [0], [0]
    total = 0
    for i in range(len(first) - 1):
        lo, hi = int(first[i]), int(first[i + 1])
        plan = plan_requests(swapped[lo:hi], sge_limit)
        plan[:, 0] += lo
        rows.append(plan)
        step = max_wr or max(len(plan), 1)
        for start in range(0, len(plan), step):
            part_first.append(total + min(start + step, len(plan)))
        total += len(plan)
        request_parts.append(len(part_first) - 1)
    wrs = np.concatenate(rows) if rows else np.zeros((0, 4), np.int64)
    return (swapped, wrs.reshape(-1, 4), np.asarray(part_first, np.int64),
            np.asarray(request_parts, np.int64))


def build_parts(swapped: np.ndarray, wrs: np.ndarray, part_first: np.ndarray, lkey: int,
                remote_addr: int, rkey: int, opcode: int = verbs.WR_RDMA_READ
                ) -> tuple[np.ndarray, np.ndarray]:
    """(work requests, SGEs) of every part as build_chain lays them, built at once (a window
    holds up to millions): within a part the requests are chained by `next`, its last one
    signalled with next NULL. An SGE's address is its destination offset: the timed loop adds
    the base of the queue pair's buffer the request lands in when it posts it, and writes the
    part's wr_id (QP << MOVER_ID_SHIFT | part) into its last request."""
    count, frags = len(wrs), len(swapped)
    wr_buf = np.zeros(max(count, 1) * verbs.WR_BYTES, np.uint8)
    sge_buf = np.zeros(max(frags, 1) * verbs.SGE_BYTES, np.uint8)
    if frags:
        s64 = sge_buf.view(np.uint64).reshape(-1, verbs.SGE_BYTES // 8)
        s32 = sge_buf.view(np.uint32).reshape(-1, verbs.SGE_BYTES // 4)
        s64[:frags, 0] = swapped[:, 0].astype(np.uint64)
        s32[:frags, 2] = swapped[:, 2].astype(np.uint32)
        s32[:frags, 3] = lkey
    if count:
        wr_base, sge_base = wr_buf.ctypes.data, sge_buf.ctypes.data
        w64 = wr_buf.view(np.uint64).reshape(-1, verbs.WR_BYTES // 8)
        w32 = wr_buf.view(np.uint32).reshape(-1, verbs.WR_BYTES // 4)
        index = np.arange(count, dtype=np.uint64)
        last = np.zeros(count, bool)
        last[np.asarray(part_first[1:], np.int64) - 1] = True
        w64[:, 0] = index
        w64[:, verbs.WR_NEXT // 8] = np.where(
            last, np.uint64(0),
            np.uint64(wr_base) + (index + np.uint64(1)) * np.uint64(verbs.WR_BYTES))
        w64[:, verbs.WR_SG_LIST // 8] = np.uint64(sge_base) \
            + wrs[:, 0].astype(np.uint64) * np.uint64(verbs.SGE_BYTES)
        w32[:, verbs.WR_NUM_SGE // 4] = wrs[:, 1].astype(np.uint32)
        w32[:, verbs.WR_OPCODE // 4] = opcode
        w32[:, verbs.WR_SEND_FLAGS // 4] = np.where(last, verbs.SEND_SIGNALED, 0).astype(np.uint32)
        w64[:, verbs.WR_REMOTE_ADDR // 8] = np.uint64(remote_addr) + wrs[:, 2].astype(np.uint64)
        w32[:, verbs.WR_RKEY // 4] = rkey
    return wr_buf, sge_buf
