"""Which method x region x attribute combinations can run on this box, and why not: plain rows
for `probe` (computed once, printed by the console)."""

from __future__ import annotations

from nearlocal.core.cases import Case, unavailable
from nearlocal.core.methods import load_methods
from nearlocal.probe import HostInventory
from nearlocal.regions import ATTRIBUTES, REGION_KINDS, load_providers, parse_region, region_kind


def region_verdicts(inventory: HostInventory) -> dict[str, str | None]:
    """Every region spec the kinds list for this box (`RegionKind.instances`, the kind's name
    when it lists none) -> None when this box can map it, else the kind's `unavailable` reason
    (gpu:0, pinned and registered:dram on a box without a GPU)."""
    load_providers()
    verdicts: dict[str, str | None] = {}
    for kind in REGION_KINDS.values():
        if kind.instances is None:  # a kind that lists nothing of its own: its name, as given
            verdicts[kind.name] = None
            continue
        for text in kind.instances(inventory):
            verdicts[text] = kind.unavailable(parse_region(text), inventory)
    return verdicts


def region_instances(inventory: HostInventory) -> list[str]:
    """The region specs this box can map: what probe lists and a spec can be aimed at."""
    return [text for text, reason in region_verdicts(inventory).items() if reason is None]


def unmappable_regions(inventory: HostInventory) -> dict[str, str]:
    """The specs the kinds list that this box cannot map, each with its reason."""
    return {text: reason for text, reason in region_verdicts(inventory).items() if reason}


def matrix(inventory: HostInventory, allow_write: bool = False,
           regions: tuple[str, ...] = ()) -> list[dict]:
    """One row per method x mappable region instance (and each region named) x attribute:
    runnable, or the reason it is not. A listed region this box cannot map is no column: probe
    names it once with its reason (`unmappable_regions`)."""
    rows = []
    for method in load_methods().values():
        for region in dict.fromkeys([*region_instances(inventory), *regions]):
            for attr in ATTRIBUTES:
                case = Case(method.name, region, attr, "16KiB",
                            peer=_default_peer(method, inventory))
                applicable = region_kind(parse_region(region)).space in method.region_spaces
                reason = unavailable(case, inventory, allow_write)
                rows.append({"method": method.name, "marker": method.marker, "region": region,
                             "attr": attr, "applicable": applicable, "runnable": reason is None,
                             "reason": reason or ""})
    return rows


def _default_peer(method, inventory: HostInventory) -> str:
    if "host" in method.peer_spaces:
        return "dram"
    for kind in REGION_KINDS.values():
        if kind.space in method.peer_spaces and kind.instances:
            found = kind.instances(inventory)
            if found:
                return found[0]
    return next(k.name for k in REGION_KINDS.values() if k.space in method.peer_spaces)
