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
