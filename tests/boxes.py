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
              "qemu-tcg-guest": 26.0, "synthetic-bare-metal": 1.0,
              # the kinds no recorded box shows (issue 47), made by the builders below
              "synthetic-bimodal-1-tick": 1.0, "synthetic-bimodal-2-tick": 2.0,
              "synthetic-2-tick-value-missing": 2.0, "synthetic-coarse-no-jitter": 24.0,
              "synthetic-heavy-interrupts": 1.0}


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


def interrupts(rng: np.random.Generator, reps: int, share: float, step: float) -> np.ndarray:
    """Readings an interrupt or a VM exit took: far out in the tail, on the clock's grid."""
    count = round(share * reps)
    ticks = np.where(rng.random(count) < 0.9, rng.integers(2_000, 20_000, count),
                     rng.integers(100_000, 10_000_000, count))
    return np.floor(ticks / step) * step


def fine_trace(rng: np.random.Generator, step: int, clusters: list[tuple[int, int, float]],
               missing: int | None = None, outliers: float = 0.002, reps: int = 20000) -> np.ndarray:
    """A fine clock (`step` ticks): the bulk in dense runs, each (first value, number of values,
    its share of the bulk), the values' weights drawn; `missing`: the index of a value dropped
    from the middle of the first run; `outliers`: interrupts' share of the readings."""
    values, weights = [], []
    for first, length, share in clusters:
        run = first + step * np.arange(length)
        if missing is not None and not values:
            run = np.delete(run, missing)
        drawn = rng.uniform(1.0, 3.0, run.size)
        values.append(run)
        weights.append(share * drawn / drawn.sum())
    values, weights = np.concatenate(values), np.concatenate(weights)
    bulk = np.repeat(values, np.maximum(1, np.rint(weights / weights.sum() * reps)).astype(np.int64))
    return rng.permutation(np.concatenate([bulk, interrupts(rng, reps, outliers, step)]))


def comb_trace(rng: np.random.Generator, step: float, steps: list[int], jitter: str,
               outliers: float = 0.002, reps: int = 20000) -> np.ndarray:
    """A scaled TSC (a step of `step` ticks, maybe fractional): readings k x step for k drawn
    from `steps`, jittered as `jitter` says: "none" (rounded), "tick" (floor of k x step plus
    a uniform tick) or "tcg" (k x step, 1 tick low in a few %, as the TCG guest reads)."""
    k = rng.choice(np.asarray(steps), reps)
    exact = k * step
    if jitter == "tick":
        bulk = np.floor(exact + rng.random(reps))
    elif jitter == "tcg":
        bulk = np.rint(exact) - (rng.random(reps) < 0.05)
    else:
        bulk = np.rint(exact)
    bulk = np.maximum(bulk, 0)
    return rng.permutation(np.concatenate([bulk, interrupts(rng, reps, outliers, step)]))


def synthetic_kinds(runs: int = 8) -> dict[str, np.ndarray]:
    """The clocks no recorded box shows, each as `runs` traces: two paths through the fences
    (two clusters) on a 1- and a 2-tick TSC, a 2-tick bulk missing a value, a coarse TSC that
    never jitters, and a 1-tick box under heavy interrupt load (5 % of the readings)."""
    rng = np.random.default_rng(47)
    kinds = {
        "synthetic-bimodal-1-tick": lambda: fine_trace(rng, 1, [(28, 8, 0.6), (71, 6, 0.4)]),
        "synthetic-bimodal-2-tick": lambda: fine_trace(rng, 2, [(40, 7, 0.5), (96, 8, 0.5)]),
        "synthetic-2-tick-value-missing": lambda: fine_trace(rng, 2, [(44, 5, 1.0)], missing=2),
        "synthetic-coarse-no-jitter": lambda: comb_trace(rng, 24.0, [2, 3, 3, 4], "none"),
        "synthetic-heavy-interrupts": lambda: fine_trace(rng, 1, [(30, 12, 1.0)], outliers=0.05),
    }
    return {name: np.stack([make().astype(np.uint64)[:20000] for _ in range(runs)])
            for name, make in kinds.items()}


def recorded_boxes() -> list[Box]:
    boxes = []
    for path in sorted(BOXES_DIR.glob("*.npz")):
        with np.load(path) as data:
            facts = json.loads(str(data["facts"])) if "facts" in data.files else {}
            boxes.append(Box(path.stem, np.asarray(data["empty_interval_ticks"]),
                             float(data["tsc_hz"]), TRUE_STEPS[path.stem], facts))
    boxes.append(Box("synthetic-bare-metal", synthetic_bare_metal(), 3.0e9,
                     TRUE_STEPS["synthetic-bare-metal"], {}))
    boxes += [Box(name, runs, 3.0e9, TRUE_STEPS[name], {}) for name, runs in synthetic_kinds().items()]
    return boxes
