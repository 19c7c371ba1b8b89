"""Helpers the host and device region kinds share (a mapping as a MappedRegion, a devdax spec's
path / offset / window), kept apart so that regions.host and regions.devices need not import
each other."""

from __future__ import annotations

import contextlib
import mmap

import numpy as np

from nearlocal.regions.base import MappedRegion, RegionSpec
from nearlocal.units import parse_size


def map_region(spec: RegionSpec, attr: str, buf: mmap.mmap, size: int, writable: bool,
               info: dict, cleanup=None, release=None) -> MappedRegion:
    """A provider's mapping as the MappedRegion kernels use (the first `size` bytes of `buf`),
    unmapped on close; release(buf), when given, takes the mapping back instead. Public: a
    region kind from a plugin needs nothing else (tests/plugin_region.py)."""
    array = np.frombuffer(buf, dtype=np.uint8, count=size)
    if not writable:
        array = array.view()
        array.flags.writeable = False

    def close() -> None:
        nonlocal array
        array = None
        if release is not None:
            release(buf)
        else:
            with contextlib.suppress(BufferError):  # a numpy view still alive: the GC unmaps it
                buf.close()
        if cleanup is not None:
            cleanup()

    return MappedRegion(spec, attr, array, writable, info, close)


def _dax_arg(spec: RegionSpec) -> tuple[str, int, int | None]:
    path, _, window = spec.arg.partition("@")
    offset_text, _, size_text = window.partition(",")
    offset = parse_size(offset_text) if offset_text and offset_text != "0" else 0
    return path, offset, parse_size(size_text) if size_text else None
