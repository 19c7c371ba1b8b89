"""The `rack` suite: every rack method on one shared pool, across the hosts of an MPI job."""

from __future__ import annotations

from nearlocal.core.cases import Case
from nearlocal.core.suites import Suite, register_suite
from nearlocal.rack.aggregate import AGGREGATE_SIZE
from nearlocal.rpc.methods import QUEUE_DEPTHS
from nearlocal.rpc.protocols import PROTOCOLS

SUITE_REGION = "shm:nearlocal-rack"
RPC_PATTERN = "rpc:128x64B"
HANDOFF_PATTERNS = ("16KiB", "kv:qwen2.5-32b:flash-attn:dense", "1024x160B")
HOSTLOSS_RECORD = "16KiB"


def rack_cases() -> list[Case]:
    cases = []
    for protocol in PROTOCOLS:
        params = (("protocol", protocol),)
        cases.append(Case("rack-rpc-roundtrip", SUITE_REGION, "wb", RPC_PATTERN, params=params))
        cases += [Case("rack-rpc-throughput", SUITE_REGION, "wb", RPC_PATTERN,
                       params=(*params, ("qd", str(qd)))) for qd in QUEUE_DEPTHS]
        cases += [Case("rack-handoff", SUITE_REGION, "wb", pattern, params=params)
                  for pattern in HANDOFF_PATTERNS]
    cases.append(Case("rack-aggregate", SUITE_REGION, "wb", AGGREGATE_SIZE, access="read"))
    cases.append(Case("rack-aggregate", SUITE_REGION, "wb", AGGREGATE_SIZE, access="write"))
    cases.append(Case("rack-host-loss", SUITE_REGION, "wb", HOSTLOSS_RECORD))
    return cases


register_suite(Suite("rack", "across the hosts of an MPI job on one shared pool: cross-host RPC "
                     "(B15), handoff publish -> usable, aggregate bandwidth, host loss",
                     [rack_cases]))
