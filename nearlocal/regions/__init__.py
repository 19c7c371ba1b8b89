"""Regions: the kinds' registry (base.py) and nearlocal's providers. Importing this package registers
no kind: `load_providers()` (called by every lookup) imports the modules of the entry-point group
nearlocal.region_kinds (nearlocal/plugins.py)."""

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
    load_providers,
    parse_region,
    region_kind,
    register_region_kind,
    remove_leftovers,
)
from nearlocal.regions.mapping import map_region

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
    "map_region",
    "parse_region",
    "region_kind",
    "register_region_kind",
    "remove_leftovers",
]
