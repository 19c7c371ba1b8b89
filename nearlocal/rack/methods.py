"""The `rack` methods: what only several hosts sharing one pool can measure. This module registers
them (what a rack method is: `framework`; each method's ranks: `remote_rpc`, `handoff`,
`aggregate`, `host_loss`; the `rack` suite: `suites`).

The rpc package's protocols do the work: slots (rpc-roundtrip's ring), records (the single-writer
/ multi-reader store) and faults (the host-loss injector). Samples are TSC ticks taken inside
compiled code on one host's clock; MPI only starts and ends phases (a barrier, the results), never
inside a timed interval.
"""

from __future__ import annotations

from nearlocal.rack.aggregate import aggregate_rows, aggregate_run, check_contiguous, slice_bytes
from nearlocal.rack.framework import RackMethod, register_rack
from nearlocal.rack.handoff import handoff_bytes, handoff_rows, handoff_run
from nearlocal.rack.host_loss import (
    HOSTLOSS_PARAMS,
    check_hostloss,
    hostloss_bytes,
    hostloss_rows,
    hostloss_rows_after_loss,
    hostloss_run,
    hostloss_straggler_s,
)
from nearlocal.rack.remote_rpc import check_qd, message_pair, ring_bytes, rpc_rows, rpc_run
from nearlocal.rpc.methods import check_rpc_pattern

register_rack(RackMethod("rack-rpc-roundtrip", lambda ctx: rpc_run(ctx, False), rpc_rows,
                         lambda resolved, ranks: ring_bytes(resolved.pattern)),
          "rpc-roundtrip across hosts: the client on each rank k >= 1 in turn, the server on "
          "rank 0, the ring in the pool", {"protocol": "flush"}, check_pattern=check_rpc_pattern,
          sample_bytes=message_pair)
register_rack(RackMethod("rack-rpc-throughput", lambda ctx: rpc_run(ctx, True), rpc_rows,
                     lambda resolved, ranks: ring_bytes(resolved.pattern)),
          "rpc-throughput across hosts: qd requests in flight from rank k to one server "
          "thread on rank 0 (Mops = 1000 / median_ns)", {"protocol": "flush", "qd": "1"},
          check_params=check_qd, check_pattern=check_rpc_pattern, sample_bytes=message_pair)
register_rack(RackMethod("rack-handoff", handoff_run, handoff_rows, handoff_bytes),
          "rank 0 publishes records (single writer, records.py), every other rank looks them "
          "up, copies and checks them: announce -> usable", {"protocol": "flush"})
register_rack(RackMethod("rack-aggregate", aggregate_run, aggregate_rows,
                     lambda resolved, ranks: ranks * slice_bytes(resolved.pattern), min_ranks=1),
          "every rank reads (or writes) its own slice of the pool, alone in turn, then all at "
          "once from one barrier: total GB/s and each host's share", {},
          check_pattern=check_contiguous, accesses=("read", "write"))
register_rack(RackMethod("rack-host-loss", hostloss_run, hostloss_rows, hostloss_bytes,
                         straggler_s=hostloss_straggler_s,
                         rows_after_loss=hostloss_rows_after_loss, may_lose_host=True),
          "the record store's writer on the last rank is SIGKILLed mid-write; readers on the "
          "other ranks must detect it within the lease, never return a torn record, recompute",
          HOSTLOSS_PARAMS, check_params=check_hostloss, sample_bytes=lambda pattern: 0)


from nearlocal.rack import suites  # noqa: E402, F401 - the rack suite
