"""Which method x region x attribute combinations can run on this box, and why not: plain rows
for `probe` (computed once, printed by the console)."""

from __future__ import annotations

from nearlocal.harness.cases import Case, unavailable
from nearlocal.harness.methods import load_methods
from nearlocal.hwprobe import HostInventory
from nearlocal.regions import ATTRIBUTES, REGION_KINDS, load_providers, parse_region, region_kind


def region_instances(inventory: HostInventory) -> list[str]:
    load_providers()
    specs: list[str] = []
    for kind in REGION_KINDS.values():
        specs += kind.instances(inventory) if kind.instances else [kind.name]
    return specs


def matrix(inventory: HostInventory, allow_write: bool = False,
           regions: tuple[str, ...] = ()) -> list[dict]:
    """One row per method x region instance (and each region named) x attribute: runnable, or
    the reason it is not."""
    rows = []
    for method in load_methods().values():
        for region in dict.fromkeys([*region_instances(inventory), *regions]):
            for attr in ATTRIBUTES:
                case = Case(method.name, region, attr, "16KiB",
                            peer=_default_peer(method, inventory))
                applicable = region_kind(parse_region(region)).family in method.region_families
                reason = unavailable(case, inventory, allow_write)
                rows.append({"method": method.name, "family": method.family, "region": region,
                             "attr": attr, "applicable": applicable, "runnable": reason is None,
                             "reason": reason or ""})
    return rows


def _default_peer(method, inventory: HostInventory) -> str:
    if "host" in method.peer_families:
        return "dram"
    for kind in REGION_KINDS.values():
        if kind.family in method.peer_families and kind.instances:
            found = kind.instances(inventory)
            if found:
                return found[0]
    return next(k.name for k in REGION_KINDS.values() if k.family in method.peer_families)
