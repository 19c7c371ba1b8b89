"""A row's facts, in one place. `row_facts` gives the columns every row of a case has whatever
happened to it (sizes, fragments, bytes moved, pool classes, whether it reaches memory, ...): the
plan calls it once per case (engine/plan.py) and every row of the case starts from it. The rest
derive the same facts for rows stored by older versions, from the registries as they are now:
the store fills them in when it loads such a run (store/reader.py). The only place the store's
data meets a registry, and only for a row that lacks a fact: loading a current run imports no
method or region module."""

from __future__ import annotations

from nearlocal.core.cases import Case, ResolvedCase, resolve
from nearlocal.core.methods import METHODS, load_methods
from nearlocal.params import encode_params
from nearlocal.regions.base import POOL_CLASSES, pool_class_of

# A read is surely from memory when it spans this many times the larger of the measured LLC and
# cpuid's: in a VM the host's L3 (cpuid's) still serves a guest's read past the measured LLC
# (18.5 GB/s at 16 MiB, 10.6 at 64 MiB on the dev VM, measured LLC 8 MiB, cpuid's 32 MiB), and a
# busy box's chase curve can read the LLC far too small (1 MiB on a shared 2-vCPU guest).
SOURCE_MEMORY_FACTOR = 2


def source_memory_bytes(llc_bytes: int, cpuid_llc_bytes: int = 0) -> int:
    """The span from which a read surely comes from memory (0: the LLC unknown)."""
    return SOURCE_MEMORY_FACTOR * max(llc_bytes, cpuid_llc_bytes)


def row_facts(case: Case | ResolvedCase, cpuless_nodes: frozenset[int] = frozenset(),
              llc_bytes: int = 0, l2_bytes: int = 0, cpuid_llc_bytes: int = 0) -> dict:
    """The columns a row has whatever happened to the case. `case`: as the plan resolved it
    (pattern, regions, spans and bytes moved are taken as they are; a bare case, from a test or
    a library caller, is resolved here); `cpuless_nodes` from the inventory (what makes numa:N a
    CXL node); `llc_bytes`: the last-level cache's size (0, unknown: every case reaches memory);
    `l2_bytes`: the core's L2 (0, unknown: no case is said to live in the LLC);
    `cpuid_llc_bytes`: the LLC cpuid reports (in a VM the host's). A case reaches
    memory (`reaches_memory`) when its method is not cacheable, its region is not write-back (an
    uncacheable or write-combining mapping bypasses the caches), or its footprint fills the LLC
    or exceeds it (a footprint of the LLC's whole size leaves no line of it to anything else,
    and the LLC is shared: memcpy 16 MiB, region and peer, in a 32 MiB L3); it lives in the LLC
    (`llc_resident`) when it does not reach memory and its footprint is over the L2.

    What it reads (its source: the region of a read, the peer a copy writes from) came from
    memory (`source_reaches_memory`) when the method's loads are not cacheable
    (Method.loads_cacheable), a read's region is not write-back, or the source spans
    `source_memory_bytes` (twice the larger LLC) or more; a case that reads nothing (stores of
    a constant) has it as `reaches_memory`. nt-copy's 16 KiB row reaches memory (its stores are
    nontemporal) while its loads of the peer hit the cache: only a row whose source and
    destination both reached memory stands for a reload, or bounds one (whatif/fit.py)."""
    resolved = case if isinstance(case, ResolvedCase) else resolve(case)
    case, pattern = resolved.case, resolved.pattern
    method = case.method_entry
    # a copy's footprint is its region and its peer (a method that never touches it maps a line)
    footprint = sum(resolved.spans)
    reaches_memory = not method.cacheable or case.attr != "wb" or footprint >= llc_bytes
    if case.access == "read" or method.touches_peer:
        source_span = resolved.spans[0 if case.access == "read" else 1]
        source_reaches_memory = (not method.loads_cacheable
                                 or (case.access == "read" and case.attr != "wb")
                                 or source_span >= source_memory_bytes(llc_bytes, cpuid_llc_bytes))
    else:  # stores of a constant read no source
        source_reaches_memory = reaches_memory
    llc_resident = not reaches_memory and 0 < l2_bytes < footprint
    return {
        **case.to_dict(),
        "pool_class": pool_class_of(resolved.region, cpuless_nodes),
        "effective_params": encode_params(dict(resolved.params)),
        "marker": method.marker,
        "region_kind": resolved.region.kind,
        "state": method.state,
        "size_bytes": pattern.total_bytes,
        "fragment_count": pattern.count,
        "fragment_bytes": pattern.fragment_bytes,
        "bytes_moved": resolved.bytes_moved,
        **{k: v for k, v in pattern.axes.items() if k not in ("fragment_count", "fragment_bytes")},
        "peer_pool_class": pool_class_of(resolved.peer, cpuless_nodes),
        "measures": method.measures,
        "reaches_memory": bool(reaches_memory),
        "source_reaches_memory": bool(source_reaches_memory),
        "llc_resident": bool(llc_resident),
    }


def effective_params_text(method: str, params: object) -> str:
    """JSON of the parameters a case really ran with: the method's declared defaults, the case's
    own (stored `params`, JSON text or a dict) over them; a method no longer registered: its own."""
    from nearlocal.params import decode_params_or_none, encode_params

    load_methods()
    given = decode_params_or_none(params)
    declared = METHODS[method].params if method in METHODS else {}
    return encode_params({**declared, **given})


def cpuless_nodes(inventory: object) -> frozenset[int]:
    """CPU-less nodes of a stored inventory (run.json's `inventory`)."""
    nodes = inventory.get("numa", []) if isinstance(inventory, dict) else []
    return frozenset(int(n["node"]) for n in nodes if isinstance(n, dict)
                     and isinstance(n.get("node"), int) and not n.get("cpus"))


def pool_class_column(stored: list, regions: list, inventory: object) -> list[str]:
    """Rows' `pool_class`: the stored column, else what the region kind declares now."""
    cpuless = cpuless_nodes(inventory)
    return [value if isinstance(value, str) and value in POOL_CLASSES
            else pool_class_of(str(region), cpuless) for value, region in zip(stored, regions,
                                                                              strict=True)]


def _flag(value: object) -> bool | None:
    """A stored boolean (Python's or numpy's); None where absent (None, NaN)."""
    return None if value is None or value != value else bool(value)


def source_reaches_memory_column(stored: list, reaches: list, methods: list) -> list[bool | None]:
    """Rows' `source_reaches_memory`: the stored column, else (rows stored before it) the row's
    `reaches_memory` where the method's loads are as cacheable as the rest of it (memcpy, load,
    DMA: its source and its stores reach memory alike), else False: a method whose loads alone
    may hit the caches (nt-copy) read its source from where the row cannot say. None where
    `reaches_memory` is absent too. Method modules are loaded only for a row that lacks it."""
    flags = [_flag(value) for value in stored]
    if all(flag is not None for flag in flags):
        return flags
    load_methods()
    column: list[bool | None] = []
    for flag, reached, name in zip(flags, reaches, methods, strict=True):
        method = METHODS.get(str(name))
        if flag is not None:
            column.append(flag)
        elif method is not None and method.loads_cacheable and not method.cacheable:
            column.append(False)
        else:
            column.append(_flag(reached))
    return column


def measures_column(stored: list, methods: list) -> list[str]:
    """Rows' `measures` (Method.measures): the stored column, else what the method declares now
    ("transfer" for a method no longer registered). The method modules are loaded only for a
    row that lacks it: reading a current run imports none."""
    known = ("transfer", "operation")
    if any(value not in known for value in stored):
        load_methods()
    return [value if value in known else getattr(METHODS.get(str(method)), "measures", "transfer")
            for value, method in zip(stored, methods, strict=True)]
