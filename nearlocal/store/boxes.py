"""Cache classes that hold between runs: the last-level cache a VM's probe measures (its usable
share of the host's L3, probe/cache.py) moves from run to run (2, 4 and 8 MiB on one day on the
development VM), and with it each case's `llc_resident` / `reaches_memory` and the yardstick
compare gives it: a 4 MiB case was "LLC" in a baseline and "memory" in its candidate.

So a store keeps, per box, the readings its runs' probes made and the LLC its cases are
classified by (`<store>/boxes/llc.json`). That LLC moves only when a reading leaves the band
[LLC / BAND, BAND x LLC], to the largest reading kept: a case whose footprint lies in the band
is "LLC or memory" on this box, and one run's probe never re-classifies it. A box whose cpuid is
trusted (bare metal) has no readings: its LLC is cpuid's, as before.
"""

from __future__ import annotations

import json
from pathlib import Path

from nearlocal import safeio
from nearlocal.errors import UsageError

BAND = 2.0
KEPT = 16  # readings kept per box
MIB = 1 << 20


def llc_file(root: Path) -> Path:
    return Path(root) / "boxes" / "llc.json"


def _records(path: Path) -> dict:
    """The store's records (empty when none yet, or when damaged: the next write replaces it)."""
    if not path.is_file():
        return {}
    try:
        records = safeio.load_json(path, "the box's kept LLC readings")
    except UsageError:
        return {}
    return records if isinstance(records, dict) else {}


def settled_llc(root: Path, box: str, reading: int) -> tuple[int, str, dict]:
    """(the LLC to classify this run's cases by, how it was decided, the record to keep) from
    this run's `reading` (bytes) and the readings the store kept for `box` (hostname, CPU,
    cpuid's caches). Nothing is written: `keep_llc` writes the record once the run measures (a
    refused run leaves the store as it was)."""
    records = _records(llc_file(root))
    entry = records.get(box) if isinstance(records.get(box), dict) else {}
    readings = [int(r) for r in entry.get("readings", []) if isinstance(r, int) and r > 0]
    readings = [*readings, int(reading)][-KEPT:]
    held = entry.get("llc") if isinstance(entry.get("llc"), int) and entry.get("llc") > 0 else None
    seen = ", ".join(f"{r / MIB:g}" for r in readings)
    if held is None:
        llc, how = reading, "this run's probe (the store's first for this box)"
    elif held / BAND <= reading <= BAND * held:
        llc, how = held, (f"held: this run's {reading / MIB:g} MiB lies within {BAND:g}x of the "
                          f"{held / MIB:g} MiB the store classifies this box's cases by")
    else:
        llc = max(readings)
        how = (f"moved: this run's {reading / MIB:g} MiB left the {BAND:g}x band around "
               f"{held / MIB:g} MiB; the largest reading kept")
    records[box] = {"readings": readings, "llc": llc}
    return llc, f"{how}; readings kept (MiB): {seen}", records


def keep_llc(root: Path, records: dict) -> None:
    """Write the records settled_llc made; a store that cannot take them is said in one line
    (UsageError), as any write into the store is."""
    path = llc_file(root)
    with safeio.writing("the box's kept LLC readings", path.parent):
        path.parent.mkdir(parents=True, exist_ok=True)
    safeio.write_output("the box's kept LLC readings", path, json.dumps(records, indent=1))
