"""What the default run measures besides local DRAM: every non-local CPU memory the box has.

`quick` gains, for each CPU-less NUMA node (CXL in system-ram mode), each other node with memory
(`numa:N`) and each device-dax device (read-only: nothing is written without --allow-write), the
read methods over quick's sizes and `chase` (idle latency) at cache and memory sizes; `chase`
runs on local `dram` too, so "How near is local" has both sides. The `mlc` suite is what Intel
MLC prints first, per region (and on `dram:thp` / `dram:2M` for the page size's share): idle
latency, peak bandwidth with every CPU of the region's node, the loaded-latency curve (a sweep
of injected delays).
"""

from __future__ import annotations

from collections.abc import Callable

from nearlocal.core.cases import Case
from nearlocal.core.methods import methods_in_role
from nearlocal.core.suites import QUICK_SIZES, Suite, extend_suite, register_suite
from nearlocal.probe import HostInventory
from nearlocal.units import format_size

CHASE_SIZES = ("16KiB", "256KiB", "4MiB", "64MiB", "1GiB")  # L1, L2, LLC, memory, >= 1 GiB
LOADED_DELAYS_NS = (0, 100, 200, 400, 800, 1600, 3200, 10000, 50000)
LOADED_SIZE = "1GiB"


def _here(inventory: HostInventory) -> int | None:
    """The node of the CPU this process runs on now (its memory is what `dram` gets)."""
    from nearlocal.cpu.threads import local_node

    return local_node(inventory.numa)


LocalNode = Callable[[HostInventory], int | None]


def pool_regions(inventory: HostInventory, local_node: LocalNode = _here) -> list[str]:
    """Every non-local CPU memory, most pool-like first: what each region kind lists for this box
    (its `instances`) whose pool class ranks above a shared mapping (device-dax, CPU-less nodes,
    other nodes with memory), less the local node. `local_node` names the local node (by default
    the node of the CPU this process runs on)."""
    from nearlocal.regions import REGION_KINDS, load_providers
    from nearlocal.regions.base import POOL_CLASSES, pool_class_of

    load_providers()
    rank = {name: index for index, name in enumerate(POOL_CLASSES)}
    local = local_node(inventory)
    found = [(rank[pool_class_of(text, inventory.cpuless_nodes)], order, text)
             for order, text in enumerate(text for kind in REGION_KINDS.values()
                                          if kind.instances is not None
                                          for text in kind.instances(inventory))]
    return [text for pool_rank, _, text in sorted(found)
            if pool_rank < rank["shared"] and text != f"numa:{local}"]


def pool_note(inventory: HostInventory, local_node: LocalNode = _here, suite: str = "quick") -> str:
    """One line on what a run of `suite` compares local memory with."""
    regions = pool_regions(inventory, local_node)
    if not regions:
        nodes = len(inventory.numa)
        found = f"this box has {nodes} NUMA node{'s' if nodes != 1 else ''} and no device-dax pool"
        return (f"{found}: quick measures local memory only (nothing to compare it with)"
                if suite == "quick" else f"{found}: no non-local memory to compare local memory with")
    return f"{suite} also measures non-local memory: " + ", ".join(regions)


def quick_pool_cases(inventory: HostInventory, local_node: LocalNode = _here) -> list[Case]:
    regions = pool_regions(inventory, local_node)
    cases = [Case(method, region, "wb", size) for method in methods_in_role("latency")
             for region in ("dram", *regions) for size in CHASE_SIZES]
    # the "read" role reads the pool (a copy's first access may be a write: memcpy's is)
    cases += [Case(method, region, "wb", format_size(size), access="read") for region in regions
              for method in methods_in_role("read") for size in QUICK_SIZES]
    return cases


def mlc_cases(inventory: HostInventory, local_node: LocalNode = _here) -> list[Case]:
    regions = ["dram", *pool_regions(inventory, local_node)]
    cases = [Case(method, region, "wb", size) for method in methods_in_role("latency")
             for region in ("dram:thp", "dram:2M", *regions) for size in CHASE_SIZES]
    cases += [Case(method, region, "wb", LOADED_SIZE, params=(("threads", "all"),))
              for region in regions for method in methods_in_role("bandwidth")]
    cases += [Case(method, region, "wb", LOADED_SIZE, params=(("delay", str(delay)),))
              for method in methods_in_role("loaded-latency")
              for region in regions for delay in LOADED_DELAYS_NS]
    return cases


def __getattr__(name: str) -> tuple[str, ...]:
    """READ_METHODS / BANDWIDTH_METHODS, the names these lists once were: registry queries."""
    roles = {"READ_METHODS": "read", "BANDWIDTH_METHODS": "bandwidth"}
    if name in roles:
        return tuple(methods_in_role(roles[name]))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


extend_suite("quick", quick_pool_cases)
register_suite(Suite("mlc", "what Intel MLC measures first, per region: idle latency (chase), "
                     "peak bandwidth with every CPU of the node, loaded-latency curve",
                     [mlc_cases], compares_pool=True))
