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
    load_providers,
    parse_region,
    region_kind,
    register_region_kind,
    remove_leftovers,
)

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
