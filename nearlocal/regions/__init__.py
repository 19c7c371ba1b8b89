"""Region providers; importing this package registers every kind."""

from nearlocal.regions.base import (
    ATTRIBUTES,
    REGION_KINDS,
    MappedRegion,
    RegionKind,
    RegionSpec,
    attribute_unavailable,
    capacity_problem,
    check_capacity,
    files_to_create,
    parse_region,
    region_kind,
    register_region_kind,
    remove_leftovers,
)

_PROVIDER_MODULES = ["nearlocal.regions.host", "nearlocal.regions.interleave", "nearlocal.regions.devices",
                     "nearlocal.gpu.regions", "nearlocal.storage.regions"]
_loaded = False


def load_providers() -> None:
    """Import every provider module once (GPU providers add themselves to _PROVIDER_MODULES)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib

    for module in _PROVIDER_MODULES:
        importlib.import_module(module)


__all__ = [
    "ATTRIBUTES",
    "REGION_KINDS",
    "MappedRegion",
    "RegionKind",
    "RegionSpec",
    "attribute_unavailable",
    "capacity_problem",
    "check_capacity",
    "files_to_create",
    "load_providers",
    "parse_region",
    "region_kind",
    "register_region_kind",
    "remove_leftovers",
]
