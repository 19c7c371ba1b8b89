"""A gate baseline record on disk (`<root>/baselines/<host_id>.json`), read and validated once
here; the gate (gate/baselines.py) decides what it means."""

from __future__ import annotations

import json
from pathlib import Path

from nearlocal import safeio
from nearlocal.errors import UsageError
from nearlocal.store.schema import shape_problem


def read_baseline(path: Path) -> dict:
    """A baseline record (`<root>/baselines/<host_id>.json`), validated once here against
    BASELINE_FIELDS; a damaged one is a one-line UsageError naming the file and the field."""
    from nearlocal.store.schema import BASELINE_FIELDS

    raw = safeio.read_input(path, "baseline")
    try:
        record = safeio.parse_nested(json.loads, raw.decode())
    except (UnicodeDecodeError, ValueError) as exc:  # binary, not JSON, nested too deep
        what = "binary" if isinstance(exc, UnicodeDecodeError) else \
            str(exc) if isinstance(exc, safeio.TooDeep) else "not JSON"
        raise UsageError(f"baseline {path} is damaged: {what}") from None
    problem = shape_problem(record, BASELINE_FIELDS)
    if not problem:
        missing = [key for key in ("run", "host_id") if not record.get(key)]
        problem = f"field {missing[0]} is missing" if missing else None
    if problem:
        raise UsageError(f"baseline {path} is damaged: {problem}")
    return record
