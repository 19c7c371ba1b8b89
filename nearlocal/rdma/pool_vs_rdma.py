"""The `pool-vs-rdma` suite: Beluga's two columns in ONE run of an MPI job across hosts. The
pool's own transfers of the papers' patterns (each host alone, on the shared pool), the rack
suite on that pool, and the rdma suite between the hosts' own DRAM, so that the report's B1, B13,
B14 and B15 lines take both columns from one run's measured rows (docs/rack.md, "Running on a
real rack"). `--region` aims the pool cases at the pool named (`Suite.pool_region`); the RDMA rows
stay on each host's DRAM, where a NIC reads and writes them.
"""

from __future__ import annotations

from nearlocal.core.cases import Case
from nearlocal.core.suites import Suite, register_suite
from nearlocal.rack.suites import SUITE_REGION, rack_cases
from nearlocal.rdma.methods import PATTERNS, rdma_cases
from nearlocal.workloads.kv_methods import quick_serving_pattern

# the pool side of each line: gathers pool -> local (B13/B14 reads) and scatters local -> pool
# (B1's 16 KB write, B13's dense write); the report takes the fastest completed row of each
POOL_READS = ("memcpy", "load")
POOL_WRITES = ("memcpy", "nt-store")


def pool_transfers() -> list[Case]:
    return [Case(method, SUITE_REGION, "wb", pattern, access=access)
            for pattern in PATTERNS
            for access, methods in (("read", POOL_READS), ("write", POOL_WRITES))
            for method in methods]


def pool_serving_read(inventory) -> list[Case]:
    """The pool's gather of a serving read (quick's, at least 4x the LLC): the papers' patterns
    above read lines the CPU's caches hold after the first repetition, so this is the one pool
    row whose source comes from the pool itself, what the what-if's cxl-pool path stands on."""
    cpu = inventory.cpu
    return [Case("memcpy", SUITE_REGION, "wb",
                 quick_serving_pattern(max(cpu.llc_bytes, cpu.cpuid_llc_bytes)), access="read")]


register_suite(Suite("pool-vs-rdma", "one MPI run across hosts: the pool's transfers of B1/B13/B14's "
                     "patterns, the rack suite on the pool, the rdma suite between the hosts' DRAM "
                     "(Beluga's two columns from one run) and a serving read's gather from the pool",
                     [pool_transfers, pool_serving_read, rack_cases, rdma_cases],
                     pool_region=SUITE_REGION))
