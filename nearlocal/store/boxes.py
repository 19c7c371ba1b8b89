"""Cache classes that hold between runs: the last-level cache a VM's probe measures (its usable
share of the host's L3, probe/cache.py) moves from run to run (2, 4 and 8 MiB on one day on the
development VM), and with it each case's `llc_resident` / `reaches_memory` and the yardstick
compare gives it: a 4 MiB case was "LLC" in a baseline and "memory" in its candidate.

So a run classifies its cases by the LLC the store's latest run of the same box held, as long
as its own probe reads within [LLC / BAND, BAND x LLC] of it; only a reading outside that band
moves it, to the largest of the readings kept. Each run keeps the readings (its own last) and
the LLC it held in its run.json (`inventory.cpu`: `llc_readings`, `measured_llc_bytes`), so the
store needs no file of its own and a refused run changes nothing. A case whose footprint lies in
the band is "LLC or memory" on this box, and one run's probe never re-classifies it. A box whose
cpuid is trusted (bare metal) measures nothing here: its LLC is cpuid's, as before.
"""

from __future__ import annotations

import json
from pathlib import Path

from nearlocal.errors import UsageError
from nearlocal.store.catalogue import list_runs
from nearlocal.store.meta import read_meta

BAND = 2.0
KEPT = 16  # readings kept per box
MIB = 1 << 20
LOOKED_AT = 64  # the newest runs searched for the box's latest


def box_key(meta_inventory: dict) -> str | None:
    """Which box a stored inventory is, for its LLC: hostname, CPU model, cpuid's caches."""
    cpu = meta_inventory.get("cpu") if isinstance(meta_inventory, dict) else None
    if not isinstance(cpu, dict):
        return None
    caches = [(c.get("level"), c.get("kind"), c.get("size_bytes")) for c in cpu.get("caches") or []
              if isinstance(c, dict)]
    return json.dumps([meta_inventory.get("hostname"), cpu.get("model"), caches])


def held_llcs(root: Path, box: str | None = None) -> dict[str, tuple[int, list[int]]]:
    """Per box, (the LLC the store's latest run of it classified by, the readings it kept): a
    run's own inventory and, in an MPI run, every host's (`host_inventories`), so each rank of
    the next job holds its own box's LLC. Plain data, sent to the ranks that have no store.
    `box`: only that one, read no further than its latest run (a plain run's start)."""
    try:
        runs = list_runs(root)
    except UsageError:
        return {}
    held: dict[str, tuple[int, list[int]]] = {}
    for path in reversed(runs[-LOOKED_AT:]):
        try:
            meta = read_meta(path)
        except UsageError:
            continue  # a damaged run is no evidence
        others = meta.get("host_inventories")
        for inventory in [meta.get("inventory"),
                          *(others.values() if isinstance(others, dict) else [])]:
            key = box_key(inventory)
            if key is None or key in held or (box is not None and key != box):
                continue
            cpu = inventory["cpu"]
            readings = [r for r in cpu.get("llc_readings") or [] if isinstance(r, int) and r > 0]
            llc = cpu.get("measured_llc_bytes")
            if readings and isinstance(llc, int) and llc > 0:
                held[key] = (llc, readings)
                if box is not None:
                    return held
    return held


def settled_llc(held_by_box: dict[str, tuple[int, list[int]]], box: str,
                reading: int) -> tuple[int, list[int], str]:
    """(the LLC to classify this run's cases by, the readings to keep with it, how it was
    decided) from this run's `reading` (bytes) and the store's latest run of `box`
    (`held_llcs`)."""
    held, readings = held_by_box.get(box, (None, []))
    readings = [*readings, int(reading)][-KEPT:]
    seen = ", ".join(f"{r / MIB:g}" for r in readings)
    if held is None:
        llc, how = reading, "this run's probe (no earlier run of this box in the store)"
    elif held / BAND <= reading <= BAND * held:
        llc, how = held, (f"held: this run's {reading / MIB:g} MiB lies within {BAND:g}x of the "
                          f"{held / MIB:g} MiB this box's runs classify by")
    else:
        llc = max(readings)
        how = (f"moved: this run's {reading / MIB:g} MiB left the {BAND:g}x band around "
               f"{held / MIB:g} MiB; the largest reading kept")
    return llc, readings, f"{how}; readings kept (MiB): {seen}"
