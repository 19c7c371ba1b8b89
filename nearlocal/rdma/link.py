"""The connection of an rdma-* case: this rank's queue pairs on its own registered region,
connected to the other rank's over endpoints exchanged by MPI; and what a kernel's status means."""

from __future__ import annotations

import os

import numpy as np

from nearlocal.probe import verbs  # ctypes only: libibverbs is loaded when a case runs
from nearlocal.rack.framework import RackContext
from nearlocal.rdma.device import _devices, path_mtu, pick_device


class _Link:
    """This rank's QP connected to the other rank's (0 <-> 1), its region registered. With
    `queue_pairs` k > 1 (movers=k): k QPs on one device context, protection domain, registered
    region and CQ, QP m connected to the other rank's QP m (`qps`, `peers`; `qp` / `peer` are
    the first)."""

    def __init__(self, ctx: RackContext, max_send_wr: int, max_sge: int, recv_cq: bool = False,
                 queue_pairs: int = 1):
        from nearlocal.probe.rdma import gid_index

        device = pick_device(_devices(), str(ctx.params.get("device", "")))
        if device is None:
            raise RuntimeError("no RDMA device with an active port on this host")
        port = device.active_port()
        self.device, self.port = device, port
        self.mtu = path_mtu(ctx.params, ctx.case.method)
        self.lib = verbs.load_library()
        self.region = ctx.pool.array
        # every QP's signalled completions (one per chain) and, after an error, its flushed ones
        depth = queue_pairs * max_send_wr + 1
        most = int(device.limits.get("max_cqe") or 0)
        self.qp = verbs.QueuePair(self.lib, device.name, port.port, gid_index(port), port.lid,
                                  self.region, max_send_wr, max_sge, recv_cq=recv_cq,
                                  cq_depth=min(depth, most) if most else depth)
        self.qps = [self.qp]
        try:
            for _ in range(queue_pairs - 1):
                self.qps.append(verbs.QueuePair(self.lib, device.name, port.port,
                                                gid_index(port), port.lid, self.region,
                                                max_send_wr, max_sge, share=self.qp))
            peer_rank = 1 - ctx.rank
            mine = [qp.endpoint(int.from_bytes(os.urandom(3), "little")) for qp in self.qps]
            ctx.world.send(mine, peer_rank, ctx.timeout_s, "sending its RDMA endpoints")
            self.peers = ctx.world.recv(peer_rank, ctx.timeout_s, "receiving the RDMA endpoints")
            self.peer = self.peers[0]
            _check_ends(self.mtu, {ctx.rank: mine[0].active_mtu, peer_rank: self.peer.active_mtu})
            for qp, me, peer in zip(self.qps, mine, self.peers, strict=True):
                qp.connect(me, peer, self.mtu)
        except BaseException:
            self.close()
            raise
        self.wc = np.zeros(verbs.WC_BYTES, np.uint8)
        self.bad = np.zeros(1, np.uint64)

    def args(self, wrs: np.ndarray) -> tuple:
        """The leading arguments of every kernel (addresses): post_send, poll_cq, qp, cq, WR
        chain, bad WR, work completion."""
        return (np.uint64(self.qp.post_send), np.uint64(self.qp.poll_cq), np.uint64(self.qp.qp),
                np.uint64(self.qp.cq), np.uint64(wrs.ctypes.data),
                np.uint64(self.bad.ctypes.data), np.uint64(self.wc.ctypes.data))

    def recv_args(self, send_wr: np.ndarray, recv_wr: np.ndarray) -> tuple:
        """The leading arguments of the send/recv RPC's kernels (addresses): post_send,
        post_recv, poll_cq, qp, send CQ, receive CQ, send WR, receive WR, bad WR, work
        completion."""
        return (np.uint64(self.qp.post_send), np.uint64(self.qp.post_recv),
                np.uint64(self.qp.poll_cq), np.uint64(self.qp.qp), np.uint64(self.qp.cq),
                np.uint64(self.qp.recv_cq), np.uint64(send_wr.ctypes.data),
                np.uint64(recv_wr.ctypes.data), np.uint64(self.bad.ctypes.data),
                np.uint64(self.wc.ctypes.data))

    def facts(self) -> dict:
        limits = {k: v for k, v in self.device.limits.items() if k != "error"}
        return {"device": self.device.name, "port": self.port.port,
                "link_layer": self.port.link_layer, "path_mtu": self.mtu,
                "active_mtu": self.qp.active_mtu or None,
                "peer_active_mtu": self.peer.active_mtu or None, **limits}

    def close(self) -> None:
        for qp in reversed(self.qps):  # the sharers first, then the QP they share
            qp.close()


def _check_ends(mtu: int, active: dict[int, int]) -> None:
    """Both ranks raise alike (each has both ends' active MTU) when the path MTU is above either
    port's: rank 0's plan checked its own port only, rank 1 may sit on another host."""
    for rank, value in sorted(active.items()):
        if value and mtu > value:
            raise RuntimeError(f"mtu={mtu} is above rank {rank}'s port active MTU {value}: the "
                               "path MTU cannot exceed either end's")


def _failed(why: int, what: str) -> RuntimeError:
    names = {1: "ibv_post_send failed", 2: "ibv_poll_cq failed",
             3: "a work completion came back with an error status", 4: "no completion in time",
             7: "ibv_post_recv failed", 8: "a reply's sequence word is not its request's",
             9: "a completion's wr_id names no mover"}
    return RuntimeError(f"{what}: {names.get(why, f'kernel status {why}')}")
