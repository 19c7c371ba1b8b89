"""The rdma-* methods: one-sided RDMA write / read and an RPC (RDMA write + poll, or send/recv)
over an RC queue pair between rank 0 and rank 1 of an MPI job (the rack machinery: endpoints
exchanged over MPI, one run). Each rank registers its own region (dram, a NUMA node,
device-dax): no shared pool.

Rank 0 posts; rank 1 is the target (one-sided) or the RPC server. The timed loops are compiled
(rdma/kernels.py); MPI only exchanges endpoints, starts phases and carries the check's bytes.
After timing, rank 1's memory is sent to rank 0 and compared to what rank 0 wrote (or read):
a check, not a timing, stated in the row (`data_check`).

The methods' parts, one module per concern: device.py (which device, what it allows, the case
checks), link.py (the queue pairs' connection), one_sided.py (rdma-write / rdma-read), rpc.py
(rdma-rpc). This module, the entry point of the group nearlocal.methods, declares the methods
and the suites.
"""

from __future__ import annotations

from nearlocal.core.cases import Case
from nearlocal.core.methods import Delivery
from nearlocal.core.movers import MOVER_PARAMS
from nearlocal.core.suites import Suite, extend_suite, register_suite
from nearlocal.rack.framework import RackMethod, register_rack
from nearlocal.rdma.device import (
    DEFAULT_MTU,
    REPLY_OFFSET,
    RPC_MESSAGE,
    _check_case,
    _check_rpc_pattern,
    _needs,
    _pool_bytes,
    host_needs,
    mtu_needs,
)
from nearlocal.rdma.one_sided import _one_sided_rows, _one_sided_run
from nearlocal.rdma.requests import SGE_VARIANTS
from nearlocal.rdma.rpc import _rpc_rows, _rpc_run

SUITE_REGION = "dram"
PATTERNS = ("16KiB", "128x20KiB", "1024x160B", "kv:qwen2.5-32b:flash-attn:dense")
CPU_FLAGS = ("rdtscp",)  # the timer; the NIC moves the bytes (no flush instruction is used)
SUITE_MTU = 4096  # the suite's large-MTU rows (InfiniBand's, RoCE's over jumbo frames)
SUITE_MOVERS = 2  # the rdma suite's 16 KiB rows by k queue pairs at once
CONTENTION_PATTERN = "kv:qwen2.5-32b:flash-attn:dense"  # the contention suite's: a dense KV block
CONTENTION_MOVERS = (1, 2, 4, 8)  # queue pairs at once (QPs, not CPUs: the same on any box)
EVERY_HOST_NEEDS = "an RDMA device"  # the line when one host of the job lacks it
# movers=k (rdma-write / rdma-read): k queue pairs, each its own transfer of the whole pattern
RDMA_PARAMS = {"sge": "batched", "device": "", "mtu": str(DEFAULT_MTU), **MOVER_PARAMS}
RPC_PARAMS = {"device": "", "mtu": str(DEFAULT_MTU), "transport": "write"}


# --- registration ----------------------------------------------------------------------------

register_rack(RackMethod("rdma-write", _one_sided_run, _one_sided_rows, _pool_bytes,
                         shared_pool=False,
                         host_needs=host_needs,
                         every_host_needs=EVERY_HOST_NEEDS),
              "one-sided RDMA write on an RC QP, rank 0 -> rank 1: the pattern's pieces as work "
              "requests split by the device's max_sge (sge=one: one per piece; movers=k: k "
              "queue pairs, each its own transfer at once)", RDMA_PARAMS,
              needs=_needs, check_case=_check_case("rdma-write"), case_needs=mtu_needs, cpu_flags=CPU_FLAGS,
              stores_in_region=True, delivery=Delivery("nic", "per-work-request"))
register_rack(RackMethod("rdma-read", _one_sided_run, _one_sided_rows, _pool_bytes,
                         shared_pool=False,
                         host_needs=host_needs,
                         every_host_needs=EVERY_HOST_NEEDS),
              "one-sided RDMA read on an RC QP: rank 0 reads rank 1's memory into the pattern's "
              "pieces (max_sge_rd SGEs per request; sge=one: one per piece; movers=k: k queue "
              "pairs, each its own transfer at once)", RDMA_PARAMS,
              needs=_needs, check_case=_check_case("rdma-read"), case_needs=mtu_needs, accesses=("read",),
              cpu_flags=CPU_FLAGS, stores_in_region=True,
              delivery=Delivery("nic", "per-work-request"))
register_rack(RackMethod("rdma-rpc", _rpc_run, _rpc_rows,
                         lambda resolved, ranks: 2 * REPLY_OFFSET, shared_pool=False, host_needs=host_needs,
                         every_host_needs=EVERY_HOST_NEEDS),
              "an RPC over RDMA RC (B15): the request RDMA-written into rank 1's slot, the reply "
              "RDMA-written back, both sides polling memory (transport=send: SEND into a posted "
              "receive each way, receive completions polled)", RPC_PARAMS, needs=_needs,
              check_pattern=_check_rpc_pattern, check_case=_check_case("rdma-rpc"), case_needs=mtu_needs,
              sample_bytes=lambda pattern: 2 * pattern.total_bytes, cpu_flags=CPU_FLAGS,
              stores_in_region=True)


def rdma_cases() -> list[Case]:
    """Each pattern written and read one request per piece and SGE-batched, the RPC both ways,
    a 16 KiB write and read at path MTU 4096: on a port whose active MTU is lower (RoCE over
    a 1500 B Ethernet MTU, soft-RoCE's 1024) those two are skipped rows saying so
    (mtu_needs), the rest of the suite runs; and a 16 KiB write and read by SUITE_MOVERS queue
    pairs at once (movers=k: contention's smallest case, beside the k = 1 rows above)."""
    cases = []
    for method, access in (("rdma-write", "write"), ("rdma-read", "read")):
        for pattern in PATTERNS:
            for variant in SGE_VARIANTS:
                cases.append(Case(method, SUITE_REGION, "wb", pattern, access=access,
                                  params=(("sge", variant),)))
    cases.append(Case("rdma-rpc", SUITE_REGION, "wb", RPC_MESSAGE))
    cases.append(Case("rdma-rpc", SUITE_REGION, "wb", RPC_MESSAGE, params=(("transport", "send"),)))
    for method, access in (("rdma-write", "write"), ("rdma-read", "read")):
        cases.append(Case(method, SUITE_REGION, "wb", "16KiB", access=access,
                          params=(("sge", "batched"), ("mtu", str(SUITE_MTU)))))
    for method, access in (("rdma-write", "write"), ("rdma-read", "read")):
        cases.append(Case(method, SUITE_REGION, "wb", "16KiB", access=access,
                          params=(("sge", "batched"), ("movers", str(SUITE_MOVERS)))))
    return cases


def contention_cases() -> list[Case]:
    """The contention suite's RDMA rows (issue 57): a dense KV block read SGE-batched by k = 1,
    2, 4, 8 queue pairs at once (each its own transfer of the whole block): the rdma hop's
    per-mover and aggregate bandwidth and service times at k. An MPI job's, like every rdma-*
    case (outside one, skipped rows saying how to launch it)."""
    return [Case("rdma-read", SUITE_REGION, "wb", CONTENTION_PATTERN, access="read",
                 params=(("sge", "batched"),) + ((("movers", str(k)),) if k > 1 else ()))
            for k in CONTENTION_MOVERS]


register_suite(Suite("rdma", "RDMA over verbs between two ranks of an MPI job: write / read of "
                     "each fragment pattern (one request per piece, and SGE-batched; 16 KiB also "
                     "at path MTU 4096 and by 2 queue pairs at once), an RPC by RDMA write and by "
                     "send/recv (B1, B2, B13-B15's RDMA side)", [rdma_cases]))
extend_suite("contention", contention_cases)
