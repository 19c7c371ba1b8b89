"""libibverbs through ctypes, no headers: set-up (device, PD, MR, CQs, RC QP, INIT -> RTR -> RTS)
and the three calls the timed loops make, whose addresses are read from the device context.

`ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` are static inlines in verbs.h that call
`qp->context->ops.post_send`, `qp->context->ops.post_recv` and `cq->context->ops.poll_cq`; the
kernels (rdma/kernels.py) call those function pointers directly from compiled code, so no Python
runs inside a timed interval.
The struct layouts are the x86-64 ABI of rdma-core's verbs.h (stable since rdma-core 12); they
are plain byte offsets here, checked against the installed header by tests/test_rdma.py (a tiny
gcc program, skipped without gcc or libibverbs-dev). In probe, below the methods: `probe`
asks the devices' limits through it, and the rdma methods set up their queue pairs with it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import struct
from dataclasses import dataclass

import numpy as np

from nearlocal.errors import UsageError

# offsets (bytes) into the structs, x86-64
CTX_POLL_CQ = 8 + 88  # ibv_context.ops.poll_cq
CTX_POST_SEND = 8 + 200  # ibv_context.ops.post_send
CTX_POST_RECV = 8 + 208  # ibv_context.ops.post_recv
QP_NUM = 52  # ibv_qp.qp_num
MR_LKEY, MR_RKEY = 36, 40
SGE_BYTES = 16  # ibv_sge: addr u64, length u32, lkey u32
WR_BYTES = 128  # ibv_send_wr
WR_NEXT, WR_SG_LIST, WR_NUM_SGE, WR_OPCODE, WR_SEND_FLAGS = 8, 16, 24, 28, 32
WR_REMOTE_ADDR, WR_RKEY = 40, 48
RECV_WR_BYTES = 32  # ibv_recv_wr: wr_id u64, next, sg_list, num_sge i32
RECV_WR_NEXT, RECV_WR_SG_LIST, RECV_WR_NUM_SGE = 8, 16, 24
WC_BYTES = 48  # ibv_wc
WC_WR_ID, WC_STATUS, WC_OPCODE, WC_BYTE_LEN = 0, 8, 12, 20  # wr_id: movers=k's mover
PORT_ATTR_BYTES = 52  # ibv_port_attr: state u32 enum 0, max_mtu 4, active_mtu 8 (enum ibv_mtu)
PORT_ATTR = {"state": 0, "max_mtu": 4, "active_mtu": 8}
INIT_ATTR_BYTES = 64  # ibv_qp_init_attr: send_cq 8, recv_cq 16, cap 32, qp_type 52, sq_sig_all 56
QP_ATTR_BYTES = 144
DEVICE_ATTR_BYTES = 232
DEVICE_ATTR = {"max_mr_size": (80, "Q"), "max_qp_wr": (112, "i"), "max_sge": (120, "i"),
               "max_sge_rd": (124, "i"), "max_cqe": (132, "i")}
# the layout facts the header test compares (name -> offset or size)
LAYOUT = {"ibv_context.ops": 8, "ops.poll_cq": 88, "ops.post_send": 200, "ops.post_recv": 208,
          "ibv_qp.qp_num": QP_NUM,
          "ibv_mr.lkey": MR_LKEY, "ibv_mr.rkey": MR_RKEY, "ibv_sge": SGE_BYTES,
          "ibv_send_wr": WR_BYTES, "ibv_send_wr.next": WR_NEXT,
          "ibv_send_wr.sg_list": WR_SG_LIST, "ibv_send_wr.num_sge": WR_NUM_SGE,
          "ibv_send_wr.opcode": WR_OPCODE, "ibv_send_wr.send_flags": WR_SEND_FLAGS,
          "ibv_send_wr.wr.rdma.remote_addr": WR_REMOTE_ADDR, "ibv_send_wr.wr.rdma.rkey": WR_RKEY,
          "ibv_recv_wr": RECV_WR_BYTES, "ibv_recv_wr.wr_id": 0, "ibv_recv_wr.next": RECV_WR_NEXT,
          "ibv_recv_wr.sg_list": RECV_WR_SG_LIST, "ibv_recv_wr.num_sge": RECV_WR_NUM_SGE,
          "ibv_wc": WC_BYTES, "ibv_wc.wr_id": WC_WR_ID, "ibv_wc.status": WC_STATUS,
          "ibv_wc.opcode": WC_OPCODE, "ibv_wc.byte_len": WC_BYTE_LEN, "ibv_qp_init_attr": INIT_ATTR_BYTES,
          "ibv_qp_init_attr.send_cq": 8, "ibv_qp_init_attr.recv_cq": 16,
          "ibv_qp_init_attr.cap": 32, "ibv_qp_init_attr.qp_type": 52,
          "ibv_qp_init_attr.sq_sig_all": 56, "ibv_qp_attr": QP_ATTR_BYTES,
          "ibv_qp_attr.path_mtu": 8, "ibv_qp_attr.rq_psn": 20, "ibv_qp_attr.sq_psn": 24,
          "ibv_qp_attr.dest_qp_num": 28, "ibv_qp_attr.qp_access_flags": 32,
          "ibv_qp_attr.ah_attr": 56, "ibv_qp_attr.max_rd_atomic": 126,
          "ibv_qp_attr.max_dest_rd_atomic": 127, "ibv_qp_attr.min_rnr_timer": 128,
          "ibv_qp_attr.port_num": 129, "ibv_qp_attr.timeout": 130,
          "ibv_qp_attr.retry_cnt": 131, "ibv_qp_attr.rnr_retry": 132,
          "ibv_ah_attr.dlid": 24, "ibv_ah_attr.is_global": 29, "ibv_ah_attr.port_num": 30,
          "ibv_global_route.sgid_index": 20, "ibv_global_route.hop_limit": 21,
          "ibv_port_attr": PORT_ATTR_BYTES,
          **{f"ibv_port_attr.{k}": v for k, v in PORT_ATTR.items()},
          "ibv_qp_cap.max_send_wr": 0, "ibv_qp_cap.max_recv_wr": 4, "ibv_qp_cap.max_send_sge": 8,
          "ibv_qp_cap.max_recv_sge": 12, "ibv_qp_cap.max_inline_data": 16,
          "ibv_device_attr": DEVICE_ATTR_BYTES,
          **{f"ibv_device_attr.{k}": v[0] for k, v in DEVICE_ATTR.items()}}

WR_RDMA_WRITE, WR_SEND, WR_RDMA_READ = 0, 2, 4
WC_RECV = 1 << 7  # ibv_wc.opcode of a receive completion (IBV_WC_RECV)
SEND_SIGNALED = 2
QPT_RC = 2
QPS_INIT, QPS_RTR, QPS_RTS = 1, 2, 3
MTU_ENUM = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}  # path MTU in bytes -> enum ibv_mtu
MTU_BYTES = {v: k for k, v in MTU_ENUM.items()}
ACCESS = 1 | 2 | 4  # local write, remote write, remote read
M_STATE, M_ACCESS, M_PKEY, M_PORT, M_AV, M_PATH_MTU, M_TIMEOUT = 1, 8, 16, 32, 128, 256, 512
M_RETRY, M_RNR_RETRY, M_RQ_PSN, M_MAX_QP_RD, M_MIN_RNR, M_SQ_PSN, M_MAX_DEST_RD, M_DEST_QPN = (
    1024, 2048, 4096, 8192, 32768, 65536, 131072, 1048576)
RD_ATOMIC = 1  # outstanding RDMA reads per QP (every device allows 1)


def load_library() -> ctypes.CDLL | None:
    """libibverbs.so.1, or None when it is not installed (probe says so)."""
    name = ctypes.util.find_library("ibverbs") or "libibverbs.so.1"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    p, i, u = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
    for fn, res, args in (
            ("ibv_get_device_list", p, [ctypes.POINTER(i)]), ("ibv_free_device_list", None, [p]),
            ("ibv_get_device_name", ctypes.c_char_p, [p]), ("ibv_open_device", p, [p]),
            ("ibv_close_device", i, [p]), ("ibv_query_device", i, [p, p]),
            ("ibv_alloc_pd", p, [p]), ("ibv_dealloc_pd", i, [p]),
            ("ibv_reg_mr", p, [p, p, ctypes.c_size_t, i]), ("ibv_dereg_mr", i, [p]),
            ("ibv_create_cq", p, [p, i, p, p, i]), ("ibv_destroy_cq", i, [p]),
            ("ibv_create_qp", p, [p, p]), ("ibv_destroy_qp", i, [p]),
            ("ibv_modify_qp", i, [p, p, i]), ("ibv_query_gid", i, [p, ctypes.c_uint8, i, p]),
            # exported (IBVERBS_1.1) beside verbs.h's static inline ___ibv_query_port, which
            # calls it when the provider has no extended query_port
            ("ibv_query_port", i, [p, ctypes.c_uint8, p])):
        getattr(lib, fn).restype = res
        getattr(lib, fn).argtypes = args
    del u
    return lib


def _read(address: int, fmt: str, offset: int):
    size = struct.calcsize(fmt)
    return struct.unpack(fmt, ctypes.string_at(address + offset, size))[0]


def device_names(lib: ctypes.CDLL) -> list[str]:
    count = ctypes.c_int(0)
    devices = lib.ibv_get_device_list(ctypes.byref(count))
    if not devices:
        return []
    try:
        array = ctypes.cast(devices, ctypes.POINTER(ctypes.c_void_p))
        return [lib.ibv_get_device_name(array[k]).decode() for k in range(count.value)]
    finally:
        lib.ibv_free_device_list(devices)


def _open(lib: ctypes.CDLL, name: str) -> int:
    count = ctypes.c_int(0)
    devices = lib.ibv_get_device_list(ctypes.byref(count))
    try:
        array = ctypes.cast(devices, ctypes.POINTER(ctypes.c_void_p)) if devices else []
        for k in range(count.value):
            if lib.ibv_get_device_name(array[k]).decode() == name:
                context = lib.ibv_open_device(array[k])
                if not context:
                    raise OSError(ctypes.get_errno(), f"ibv_open_device({name}) failed")
                return context
    finally:
        if devices:
            lib.ibv_free_device_list(devices)
    raise UsageError(f"RDMA device {name!r} does not exist (libibverbs lists: "
                     f"{', '.join(device_names(lib)) or 'none'})")


def query_device(lib: ctypes.CDLL, name: str, ports: list[int]) -> tuple[dict, dict[int, dict]]:
    """One open of the device: ibv_query_device's limits that decide the work requests
    (max_sge, max_sge_rd, max_qp_wr, max_mr_size, max_cqe), and ibv_query_port's state, max_mtu
    and active_mtu (MTUs in bytes) of each port named; a port whose query fails is left out
    (sysfs has no active_mtu file)."""
    context = _open(lib, name)
    try:
        return _limits(lib, context), {port: got for port in ports
                                       if (got := port_attr(lib, context, port))}
    finally:
        lib.ibv_close_device(context)


def port_attr(lib: ctypes.CDLL, context: int, port: int) -> dict:
    """{state, max_mtu, active_mtu} of one port of an open device ({} when the query fails).
    The buffer is twice ibv_port_attr: the exported call takes the older, shorter compat struct
    and a provider may write the whole current one."""
    attr = ctypes.create_string_buffer(2 * PORT_ATTR_BYTES)
    if lib.ibv_query_port(context, port, attr):
        return {}
    state, max_mtu, active_mtu = (struct.unpack_from("I", attr.raw, PORT_ATTR[k])[0]
                                  for k in ("state", "max_mtu", "active_mtu"))
    return {"state": state, "max_mtu": MTU_BYTES.get(max_mtu, 0),
            "active_mtu": MTU_BYTES.get(active_mtu, 0)}


def _limits(lib: ctypes.CDLL, context: int) -> dict:
    attr = ctypes.create_string_buffer(DEVICE_ATTR_BYTES)
    if lib.ibv_query_device(context, attr):
        raise OSError(ctypes.get_errno(), "ibv_query_device failed")
    return {k: struct.unpack_from(fmt, attr.raw, off)[0] for k, (off, fmt) in DEVICE_ATTR.items()}


@dataclass(frozen=True)
class Endpoint:
    """What the peer needs to connect to this QP and reach its memory (plain data over MPI)."""

    qp_num: int
    gid: bytes
    lid: int
    psn: int
    addr: int
    rkey: int
    active_mtu: int = 0  # its port's, bytes (0: unknown): the path MTU may not exceed either end's


class QueuePair:
    """One RC QP on `device` with `region` (a numpy byte array, the rank's mapping) registered:
    the set-up is Python (ctypes), the data path is the kernels'.

    `recv_cq`: give the QP a receive CQ of its own (the send/recv RPC). Otherwise one CQ takes
    both queues' completions, as every one-sided transfer has (no receive is ever posted).

    `share`: another QueuePair whose device context, protection domain, registered region and
    CQ this one uses (the k queue pairs of `movers=k` completing on one CQ, each work
    completion's wr_id naming its QP's chain); only the QP is its own, and only the QP is
    destroyed by its `close` (close the sharers before the one shared). `cq_depth`: the CQ's
    entries when it is created here (at least max_send_wr + 1)."""

    def __init__(self, lib: ctypes.CDLL, device: str, port: int, gid_index: int, lid: int,
                 region: np.ndarray, max_send_wr: int, max_sge: int, recv_cq: bool = False,
                 share: QueuePair | None = None, cq_depth: int = 0):
        self.lib, self.port, self.gid_index, self.lid = lib, port, gid_index, lid
        self._held: list = []
        self.recv_cq = None
        self._owned = ("qp",) if share is not None else (
            "qp", "recv_cq", "cq", "mr", "pd", "context")
        if share is not None:
            for name in ("context", "limits", "port_attr", "pd", "region", "mr", "cq"):
                setattr(self, name, getattr(share, name))
        else:
            self.context = _open(lib, device)
        try:
            if share is None:
                self.limits = _limits(lib, self.context)
                self.port_attr = port_attr(lib, self.context, port)
                self.pd = self._must(lib.ibv_alloc_pd(self.context), "ibv_alloc_pd")
                self.region = region
                self.mr = self._must(lib.ibv_reg_mr(self.pd, region.ctypes.data, region.nbytes,
                                                    ACCESS), f"ibv_reg_mr of {region.nbytes} bytes")
                depth = max(max_send_wr + 1, cq_depth)
                self.cq = self._must(lib.ibv_create_cq(self.context, depth, None, None, 0),
                                     "ibv_create_cq")
            if recv_cq:
                self.recv_cq = self._must(lib.ibv_create_cq(self.context, 2, None, None, 0),
                                          "ibv_create_cq (receive)")
            init = bytearray(INIT_ATTR_BYTES)
            struct.pack_into("QQ", init, 8, self.cq, self.recv_cq or self.cq)
            struct.pack_into("IIIII", init, 32, max_send_wr, 1, max_sge, 1, 0)
            struct.pack_into("ii", init, 52, QPT_RC, 0)
            buf = ctypes.create_string_buffer(bytes(init), INIT_ATTR_BYTES)
            self.qp = self._must(lib.ibv_create_qp(self.pd, buf), "ibv_create_qp")
        except BaseException:
            self.close()
            raise
        self.lkey = _read(self.mr, "I", MR_LKEY)
        self.rkey = _read(self.mr, "I", MR_RKEY)
        self.qp_num = _read(self.qp, "I", QP_NUM)
        self.post_send = _read(self.context, "Q", CTX_POST_SEND)
        self.post_recv = _read(self.context, "Q", CTX_POST_RECV)
        self.poll_cq = _read(self.context, "Q", CTX_POLL_CQ)

    @property
    def active_mtu(self) -> int:
        """The port's active MTU in bytes (0: the query failed)."""
        return int(self.port_attr.get("active_mtu", 0))

    def post_receive(self, wr: np.ndarray) -> None:
        """ibv_post_recv of the prebuilt `ibv_recv_wr` in `wr` (untimed: from Python)."""
        call = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
        bad = ctypes.c_void_p(0)
        code = call(self.post_recv)(self.qp, wr.ctypes.data, ctypes.addressof(bad))
        if code:
            raise OSError(code, f"ibv_post_recv failed: error {code}")

    def _must(self, handle: int | None, what: str) -> int:
        if not handle:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what} failed: {errno and __import__('os').strerror(errno)}")
        return handle

    def endpoint(self, psn: int) -> Endpoint:
        gid = ctypes.create_string_buffer(16)
        if self.lib.ibv_query_gid(self.context, self.port, self.gid_index, gid):
            raise OSError(ctypes.get_errno(), f"ibv_query_gid index {self.gid_index} failed")
        return Endpoint(self.qp_num, gid.raw, self.lid, psn, int(self.region.ctypes.data),
                        self.rkey, self.active_mtu)

    def _modify(self, fields: list[tuple[int, str, int]], mask: int, what: str) -> None:
        attr = bytearray(QP_ATTR_BYTES)
        for offset, fmt, value in fields:
            struct.pack_into(fmt, attr, offset, value)
        buf = ctypes.create_string_buffer(bytes(attr), QP_ATTR_BYTES)
        code = self.lib.ibv_modify_qp(self.qp, buf, mask)
        if code:
            raise OSError(code, f"ibv_modify_qp to {what} failed: error {code}")

    def connect(self, me: Endpoint, peer: Endpoint, mtu: int = 1024) -> None:
        """RESET -> INIT -> RTR (the peer's QPN, GID/LID, PSN; path MTU `mtu` bytes) -> RTS: an
        RC connection."""
        self._modify([(0, "i", QPS_INIT), (120, "H", 0), (129, "B", self.port),
                      (32, "I", ACCESS)], M_STATE | M_PKEY | M_PORT | M_ACCESS, "INIT")
        roce = peer.lid == 0
        ah = 56
        rtr = [(0, "i", QPS_RTR), (8, "i", MTU_ENUM[mtu]), (28, "I", peer.qp_num),
               (20, "I", peer.psn), (127, "B", RD_ATOMIC), (128, "B", 12),
               (ah + 24, "H", peer.lid), (ah + 29, "B", 1 if roce else 0),
               (ah + 30, "B", self.port)]
        if roce:
            rtr += [(ah + 20, "B", self.gid_index), (ah + 21, "B", 64)]
            rtr += [(ah + k, "B", b) for k, b in enumerate(peer.gid)]
        self._modify(rtr, M_STATE | M_AV | M_PATH_MTU | M_DEST_QPN | M_RQ_PSN | M_MAX_DEST_RD
                     | M_MIN_RNR, "RTR")
        self._modify([(0, "i", QPS_RTS), (130, "B", 14), (131, "B", 7), (132, "B", 7),
                      (24, "I", me.psn), (126, "B", RD_ATOMIC)],
                     M_STATE | M_TIMEOUT | M_RETRY | M_RNR_RETRY | M_SQ_PSN | M_MAX_QP_RD, "RTS")

    def close(self) -> None:
        lib = self.lib
        for name, destroy in (("qp", lib.ibv_destroy_qp), ("recv_cq", lib.ibv_destroy_cq),
                              ("cq", lib.ibv_destroy_cq),
                              ("mr", lib.ibv_dereg_mr), ("pd", lib.ibv_dealloc_pd),
                              ("context", lib.ibv_close_device)):
            handle = getattr(self, name, None)
            if handle and name in self._owned:
                destroy(handle)
            if handle:
                setattr(self, name, None)
