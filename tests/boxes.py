"""The recorded boxes (tests/fixtures/boxes, README there): every machine kind the project met,
as a trace of its clock, plus a synthetic bare-metal one. Each box says what its TSC really
does (its step in ticks), read from the values themselves, not from nearlocal's estimate."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BOXES_DIR = Path(__file__).parent / "fixtures" / "boxes"
# the step each recorded trace's TSC really moves in: every reading of the Intel guest is even,
# every reading of the AMD guest a multiple of 26, every reading of the TCG guest (run on that AMD
# guest: TCG hands it the host's TSC) within one tick of a multiple of 26 (README.md says how
# each was read)
TRUE_STEPS = {"intel-xeon-m207-kvm-2vcpu": 2.0, "amd-epyc-kvm-2vcpu": 26.0,
              "qemu-tcg-guest": 26.0, "synthetic-bare-metal": 1.0}


@dataclass
class Box:
    name: str
    runs: np.ndarray  # (runs, readings) uint64 ticks of an empty fenced interval
    tsc_hz: float
    true_step: float
    facts: dict


def synthetic_bare_metal(seed: int = 3, runs: int = 32, reps: int = 20000) -> np.ndarray:
    """A bare-metal TSC: 1-tick steps, an empty interval of ~28-40 ticks (fences jitter it by a
    few), timer interrupts (~0.2 %, 2-20 k ticks) and a rarer SMI or VM exit (up to 10 M ticks)."""
    rng = np.random.default_rng(seed)
    bulk = np.rint(rng.gamma(9.0, 1.2, (runs, reps)) + 24).astype(np.int64)
    interrupts = rng.random((runs, reps)) < 0.002
    bulk[interrupts] = rng.integers(2000, 20000, int(interrupts.sum()))
    exits = rng.random((runs, reps)) < 0.0002
    bulk[exits] = rng.integers(100_000, 10_000_000, int(exits.sum()))
    return bulk.astype(np.uint64)


def recorded_boxes() -> list[Box]:
    boxes = []
    for path in sorted(BOXES_DIR.glob("*.npz")):
        with np.load(path) as data:
            facts = json.loads(str(data["facts"])) if "facts" in data.files else {}
            boxes.append(Box(path.stem, np.asarray(data["empty_interval_ticks"]),
                             float(data["tsc_hz"]), TRUE_STEPS[path.stem], facts))
    boxes.append(Box("synthetic-bare-metal", synthetic_bare_metal(), 3.0e9,
                     TRUE_STEPS["synthetic-bare-metal"], {}))
    return boxes
