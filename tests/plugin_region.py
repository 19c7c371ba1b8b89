"""A third-party region kind as a plugin (NEARLOCAL_PLUGINS=tests.plugin_region): its provider and
its one registration, nothing else. `scratch` is private anonymous memory, as `dram` without its
options; probe lists it, `--region` help names it, and every host method runs on it."""

from __future__ import annotations

import mmap

from nearlocal.regions import RegionKind, map_region, register_region_kind


def _open(spec, size: int, attr: str, allow_write: bool):
    buf = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
    return map_region(spec, attr, buf, size, True, {"memtype": "write-back (a plugin's memory)"})


register_region_kind(RegionKind(
    name="scratch", syntax="scratch", space="host", attrs=frozenset({"wb"}),
    summary="private anonymous memory (a plugin's region kind)",
    validate=lambda spec, inventory: None, unavailable=lambda spec, inventory: None, open=_open,
    instances=lambda inventory: ["scratch"], pool_class="local",
))
