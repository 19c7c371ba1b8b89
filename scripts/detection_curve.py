"""Code CI's detection curve on this box (docs/ci.md, issue 56): how often `bash
scripts/take_turns.sh BASE` reads a REAL regression of a tree's kernel `slower`, per kernel and
size of regression, and how often it reads unchanged code `slower`.

Each candidate is a copy of this checkout whose kernels do more work inside the timed
interval, the figure still divided by the nominal work: the chase (kernels/chase.py time_chase)
and the host probes' walk (kernels/yardstick.py) walk more hops; load, nt-store and nt-copy
(kernels/cpu.py) run each pass over the pattern's fragments and then over a leading share of
its bytes (whole copies of the pattern first beyond 2x), one fence a pass as before. The extra
work is the kernel's own, on the same lines in the same cache state, so it scales with the base
kernel's time on any box (a delay chain does not: issue 56's "~10x" chain of 4,000
multiply-adds compiled to a closed form and read 1.2x). Its size is calibrated and verified
alone (`calibrate`, `measure_alone`): the regressed kernel and the base's, loaded side by side
in this process, are timed in turns on one ring or pair of buffers, and the extra work is
scaled until the regressed one reads `factor` times the base's (a pass's cost is not linear in
its bytes). The table quotes the slowdown measured alone beside the nominal one.

Then, round by round, every candidate (and an unchanged copy of the base: the false positives)
takes turns with the base as the README gives it (take_turns.sh, --for-gate code, --processes
and --budget below) over one small suite: chase 64 KiB (L2) and 64 MiB (memory), load /
nt-store / nt-copy 64 KiB (a plugin written into WORKDIR). A regressed case is caught when it
reads `slower`; the probes' regression (no case walks it) when the report names the
candidate's probe code as what moved them. One tree per factor regresses every kernel at
once, so each pair counts once per case; the unchanged pairs count every case.

    python3 scripts/detection_curve.py [WORKDIR] [--pairs 10] [--factors 1.05,1.1,1.2,1.3,2]
        [--processes 16] [--budget 0.2] [--json OUT.json]

It prints a Markdown table (docs/ci.md quotes it) and the wall time; WORKDIR keeps the trees,
the runs and `curve.json`. The default (10 rounds of 6 pairs: 5 regressed trees and the
unchanged one, each with the base; 12 processes, 0.15 s a case) took 14.4 min on the quiet
2-core VM (13-14 s a pair; 30-38 s while the box was shared, load average 3.6-5), and after the
first round the script prints how long all rounds will take.
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FACTORS = (1.05, 1.1, 1.2, 1.3, 2.0)
SUITE = "detect"
PLUGIN = "nearlocal_detect_suite"
PLUGIN_SOURCE = '''"""Written by scripts/detection_curve.py: the cases its pairs measure."""
from nearlocal.core.cases import Case
from nearlocal.core.suites import Suite, register_suite

CASES = {cases!r}
register_suite(Suite("{suite}", "detection curve: one case per regressed kernel and size",
                     [lambda: [Case(m, "dram", "wb", s) for m, s in CASES]]))
'''
IGNORE = (".git", ".venv", "results", "tests", "docs", "examples", ".*cache", ".hypothesis",
          "*.egg-info", "nearlocal-*")

# Each regression: appended to the tree's kernel file, it redefines the timed kernel (the
# sessions look their kernel up when they open). EXTRA is factor - 1.
CHASE_TEMPLATE = '''

# --- injected by scripts/detection_curve.py: {name} walks {factor}x its hops ---
@njit(cache=True, nogil=True)
def {name}(words, hops, samples, position):
    p = np.uint64(position[0])
    walked = hops + int(hops * {extra!r} + 0.5)
    for r in range(samples.size):
        t0 = tsc_begin()
        for _ in range(walked):
            p = words[p]
        t1 = tsc_end()
        samples[r] = t1 - t0
    position[0] = p
'''
SHARE = '''

# --- injected by scripts/detection_curve.py: a pattern's fragments, 1 + extra times over ---
@njit(cache=True)
def _injected_more(frags, extra):
    whole = int(extra)
    total = 0
    for i in range(frags.shape[0]):
        total += frags[i, 2]
    want = int((extra - whole) * total / 64 + 0.5) * 64
    out = np.empty(((2 + whole) * frags.shape[0], 3), np.int64)
    n = 0
    for _ in range(1 + whole):
        for i in range(frags.shape[0]):
            out[n] = frags[i]
            n += 1
    for i in range(frags.shape[0]):
        if want <= 0:
            break
        take = min(frags[i, 2], want)
        out[n, 0] = frags[i, 0]
        out[n, 1] = frags[i, 1]
        out[n, 2] = take
        n += 1
        want -= take
    return out[:n]
'''
PASS_TEMPLATE = '''

# --- injected by scripts/detection_curve.py: {name} does {factor}x its work a pass ---
@njit(cache=True)
def {name}(src, dst, frags, samples, sink, drain=True, passes=1):
    more = _injected_more(frags, {extra!r})  # one pass (one fence) over 1 + extra the bytes
    acc = load_pass(src, dst, frags)
    for r in range(samples.size):
        t0 = _begin(drain)
        for k in range(passes):
            _between(drain, k)
            acc ^= {call}(src, dst, more)
        t1 = tsc_end()
        samples[r] = t1 - t0
    sink[0] = acc
'''


@dataclass(frozen=True)
class Kernel:
    """One kernel a tree's regression goes into, and the cases that measure it."""

    name: str
    path: str  # its file, from a tree's root
    function: str  # the timed kernel the template redefines
    template: str
    cases: tuple[tuple[str, str], ...]  # (method, size); none: the host probes' kernel
    call: str = ""  # the pass a pass kernel runs (it returns an xor or None: 0 then)


KERNELS = {k.name: k for k in (
    Kernel("chase", "nearlocal/kernels/chase.py", "time_chase", CHASE_TEMPLATE,
           (("chase", "64KiB"), ("chase", "64MiB"))),
    Kernel("load", "nearlocal/kernels/cpu.py", "time_load", PASS_TEMPLATE,
           (("load", "64KiB"),), "load_pass"),
    Kernel("nt-store", "nearlocal/kernels/cpu.py", "time_nt_store", PASS_TEMPLATE,
           (("nt-store", "64KiB"),), "_injected_nt_store"),
    Kernel("nt-copy", "nearlocal/kernels/cpu.py", "time_nt_copy", PASS_TEMPLATE,
           (("nt-copy", "64KiB"),), "_injected_nt_copy"),
    Kernel("probe", "nearlocal/kernels/yardstick.py", "probe_time_chase", CHASE_TEMPLATE, ()),
)}
# the store passes return nothing: wrapped to return 0 so one template xors them all
WRAPPERS = '''

@njit(cache=True, inline="always")
def _injected_nt_store(src, dst, frags):
    nt_store_pass(src, dst, frags)
    return np.uint64(0)


@njit(cache=True, inline="always")
def _injected_nt_copy(src, dst, frags):
    nt_copy_pass(src, dst, frags)
    return np.uint64(0)
'''


def checkout_copy(root: Path, where: Path) -> Path:
    """A tree with this checkout's code (no git, no venv, no tests), its numba caches kept:
    the files a regression leaves alone are not compiled again."""
    if where.exists():  # a WORKDIR run before: its trees are laid anew from this checkout
        shutil.rmtree(where)
    shutil.copytree(root, where, ignore=shutil.ignore_patterns(*IGNORE))
    return where


def inject(tree: Path, extras: dict[str, float]) -> None:
    """Make each kernel of `extras` in the tree at `tree` do 1 + its extra times its work (the
    kernel files rewritten from this checkout's, so a tree can be injected again)."""
    added: dict[str, list[str]] = {}
    for name, extra in extras.items():
        if not 0 < extra <= 63:
            raise ValueError(f"a regression's extra work lies in (0, 63], got {extra}")
        kernel = KERNELS[name]
        parts = added.setdefault(kernel.path, [])
        if kernel.call and SHARE not in parts:
            parts += [SHARE, WRAPPERS]
        parts.append(kernel.template.format(name=kernel.function, factor=f"{1 + extra:.3g}",
                                            extra=extra, call=kernel.call))
    for path, parts in added.items():
        (tree / path).write_text((ROOT / path).read_text() + "".join(parts))


# ------------------------------------------------------------------ the slowdown, measured alone

_MODULES: dict[tuple[str, int], types.ModuleType] = {}


def load_module(path: Path) -> types.ModuleType:
    """A tree's kernel file as a module of its own (numba's cache off: nothing is written into
    the tree, and two trees' kernels live side by side in this process); loaded again only
    when the file changed."""
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _MODULES:
        name = re.sub(r"\W", "_", f"_alone_{path}_{key[1]}")
        module = types.ModuleType(name)
        module.__file__ = str(path)
        sys.modules[name] = module
        source = path.read_text().replace("cache=True", "cache=False")
        exec(compile(source, str(path), "exec"), module.__dict__)
        _MODULES[key] = module
    return _MODULES[key]


def _buffer(nbytes: int) -> tuple[mmap.mmap, np.ndarray]:
    """Pages as the cases' plain dram region and the probes' rings have them (4 KiB whatever
    THP's mode), so the slowdown measured alone is the one the pairs see."""
    from nearlocal.regions.memory import advise_pages, populate

    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advise_pages(buf, "4K")
    populate(buf)
    return buf, np.frombuffer(buf, np.uint8)


def _arguments(kernel: Kernel, nbytes: int) -> tuple[list, tuple]:
    """The mappings to keep open, and the arguments both trees' kernels are called with: ONE
    ring or one pair of buffers, so only the code differs between them."""
    if not kernel.call:  # a chase
        from nearlocal.kernels.chase import LINE, build_ring

        buf, array = _buffer(nbytes)
        words = array.view(np.uint64)
        build_ring(words, nbytes // LINE, 3)
        return [buf], (words, CHASE_HOPS, np.empty(31, np.uint64), np.zeros(1, np.uint64))
    (sbuf, src), (dbuf, dst) = _buffer(nbytes), _buffer(nbytes)
    frags = np.array([[0, 0, nbytes]], np.int64)
    return [sbuf, dbuf], (src, dst, frags, np.empty(31, np.uint64), np.zeros(1, np.uint64),
                          True, 1)


CHASE_HOPS = 4096


def measure_alone(base: Path, cand: Path, kernel_name: str, size: str,
                  rounds: int = 41) -> float:
    """The regressed kernel's time over the base's, on the same ring or buffers, in this
    process, called in turns (base, candidate; candidate, base; ...): the median of the rounds'
    ratios of their samples' medians."""
    from nearlocal.units import parse_size

    kernel = KERNELS[kernel_name]
    keep, args = _arguments(kernel, parse_size(size))
    ticks = args[3] if kernel.call else args[2]
    fns = [getattr(load_module(tree / kernel.path), kernel.function) for tree in (base, cand)]

    def timed(i: int) -> float:
        fns[i](*args)
        return float(np.median(ticks))

    timed(0), timed(1)  # compiled and warm
    ratios = []
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        figure = {i: timed(i) for i in order}
        ratios.append(figure[1] / figure[0])
    del keep
    return float(np.median(ratios))


def calibrate(base: Path, cand: Path, kernel: str, factor: float, tries: int = 6,
              ) -> tuple[float, float]:
    """The extra work that makes the kernel `factor` times slower alone (within a tenth of the
    extra, or 0.01); (extra, measured). The first try does factor - 1 of the kernel's work,
    the next scales it by what that measured; then, once two tries bracket the factor, the
    extra is interpolated between them (a pass's cost is not linear in its bytes: a short
    share of a non-temporal store pays a whole drain)."""
    size = KERNELS[kernel].cases[0][1] if KERNELS[kernel].cases else "64KiB"
    low, high = (0.0, 1.0), (math.inf, math.inf)  # (extra, measured) below and above factor
    extra, best = factor - 1, (factor - 1, math.nan)
    for _ in range(tries):
        inject(cand, {kernel: extra})
        measured = measure_alone(base, cand, kernel, size)
        if math.isnan(best[1]) or abs(measured - factor) < abs(best[1] - factor):
            best = (extra, measured)
        if abs(measured - factor) <= max(0.1 * (factor - 1), 0.01):
            break
        if measured < factor:
            low = max(low, (extra, measured))
        else:
            high = min(high, (extra, measured))
        if math.isfinite(high[0]) and low[0] > 0:  # bracketed: interpolate
            share = (factor - low[1]) / max(high[1] - low[1], 1e-9)
            extra = low[0] + min(max(share, 0.1), 0.9) * (high[0] - low[0])
        else:
            extra = min(63.0, extra * (factor - 1) / max(measured - 1, 0.2 * (factor - 1)))
    inject(cand, {kernel: best[0]})
    return best


# ------------------------------------------------------------------------------ pairs in turns

def python() -> str:
    return os.environ.get("PYTHON", sys.executable)


def take_turns(base: Path, cand: Path, store: Path, plugin_dir: Path, run_args: list[str],
               ) -> dict:
    """The README's code CI (the candidate's scripts/take_turns.sh BASE), then compare's JSON."""
    env = {**os.environ, "NEARLOCAL_STORE": str(store), "PYTHON": python(),
           "NEARLOCAL_PLUGINS": PLUGIN, "TMPDIR": str(store.parent),
           "PYTHONPATH": str(plugin_dir)}
    done = subprocess.run(["bash", str(cand / "scripts" / "take_turns.sh"), str(base),
                           "--suite", SUITE, *run_args], capture_output=True, text=True,
                          env=env, cwd=cand)
    if done.returncode not in (0, 1):
        raise SystemExit(f"take_turns.sh {base} from {cand} failed:\n{done.stdout}{done.stderr}")
    runs = re.search(r"baseline run (\S+), candidate run (\S+)", done.stderr)
    if runs is None:
        raise SystemExit(f"take_turns.sh stored no runs:\n{done.stderr}")
    env["PYTHONPATH"] = f"{cand}:{plugin_dir}"
    report = subprocess.run([python(), "-P", "-m", "nearlocal", "compare", runs[1], runs[2],
                             "--out", str(store), "--mode", "code", "--format", "json"],
                            capture_output=True, text=True, env=env, cwd=cand)
    if report.returncode not in (0, 1):
        raise SystemExit(f"compare {runs[1]} {runs[2]} failed: {report.stderr.strip()}")
    result = json.loads(report.stdout)
    result["exit"] = done.returncode
    return result


def caught(report: dict) -> dict[str, bool]:
    """Per case id, whether it read `slower`; under "probe", whether the report says the
    candidate's probe code moved a host probe; under "probe moved, same code", whether a probe
    read differently on the two sides' turns with the same probe code (their own rings)."""
    out = {c["case_id"]: c["verdict"] == "slower" for c in report["cases"]}
    moved = [p.get("moved_by") for p in report.get("host_probes", [])]
    out["probe"] = "candidate probe code" in moved
    out["probe moved, same code"] = "candidate run" in moved
    return out


def case_id(method: str, size: str) -> str:
    return f"{method}/dram/wb/{size}"


def tally(results: dict[str, list[dict[str, bool]]]) -> dict[str, dict[str, list[int]]]:
    """{config: [per pair {case: caught}]} -> {row: {config: [caught, pairs]}}; the rows are the
    regressed cases and "probe"."""
    rows: dict[str, dict[str, list[int]]] = {}
    for config, pairs in results.items():
        for pair in pairs:
            for case, hit in pair.items():
                cell = rows.setdefault(case, {}).setdefault(config, [0, 0])
                cell[0] += int(hit)
                cell[1] += 1
    return rows


def smallest_caught(row: dict[str, list[int]], factors: list[float], share: float = 0.9) -> str:
    """The smallest factor caught in at least `share` of its pairs, above which every factor
    is too ("none" if none)."""
    best = "none"
    for factor in sorted(factors, reverse=True):
        hit, pairs = row.get(f"{factor:g}x", [0, 0])
        if pairs == 0 or hit < share * pairs:
            break
        best = f"{factor:g}x"
    return best


def table(summary: dict, factors: list[float]) -> str:
    """The Markdown table docs/ci.md quotes: per regressed case, caught / pairs at each factor
    (the measured-alone slowdown in brackets), false `slower` on unchanged pairs, and the
    smallest factor caught in >= 9 of 10."""
    heads = [f"{f:g}x" for f in factors]
    lines = ["| kernel, case | " + " | ".join(heads) + " | unchanged: false `slower` | "
             "smallest caught in >= 90 % |",
             "|---|" + "---|" * (len(heads) + 2)]
    for kernel in summary["kernels"]:
        for case in [case_id(m, s) for m, s in KERNELS[kernel].cases] or ["probe"]:
            row = summary["rows"].get(case, {})
            cells = []
            for head in heads:
                hit, pairs = row.get(head, [0, 0])
                alone = summary["alone"].get(head, {}).get(case)
                cells.append(f"{hit}/{pairs}" + (f" ({alone:.2f}x)" if alone else ""))
            fp = row.get("unchanged", [0, 0])
            label = f"{kernel}, {case}" if case != "probe" else \
                "host probes' walk (its move named the candidate's probe code)"
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {fp[0]}/{fp[1]} | "
                         f"{smallest_caught(row, factors)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", nargs="?", type=Path)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--factors", default=",".join(f"{f:g}" for f in FACTORS))
    parser.add_argument("--kernels", default=",".join(KERNELS))
    parser.add_argument("--processes", type=int, default=12)
    parser.add_argument("--budget", default="0.15")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    try:
        factors = [float(f) for f in args.factors.split(",")]
        kernels = args.kernels.split(",")
        if not all(1 < f <= 64 for f in factors) or not set(kernels) <= set(KERNELS) \
                or args.pairs < 1 or args.processes < 1 or not float(args.budget) > 0:
            raise ValueError
    except ValueError:
        print(f"error: --factors takes numbers in (1, 64], --kernels names of "
              f"{', '.join(KERNELS)}, --pairs and --processes counts of 1 or more, --budget "
              "seconds above 0", file=sys.stderr)
        return 2
    if args.json is not None and not args.json.parent.is_dir():
        print(f"error: --json {args.json}: its folder does not exist", file=sys.stderr)
        return 2
    started = time.time()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="nearlocal-detect."))
    work.mkdir(parents=True, exist_ok=True)
    plugin_dir = work / "plugin"
    plugin_dir.mkdir(exist_ok=True)
    cases = [c for k in kernels for c in KERNELS[k].cases]
    (plugin_dir / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE.format(cases=cases, suite=SUITE))
    base = checkout_copy(ROOT, work / "base")
    trees = {"unchanged": checkout_copy(ROOT, work / "twin")}
    alone: dict[str, dict[str, float]] = {}
    extras: dict[str, dict[str, float]] = {}
    for factor in factors:
        config = f"{factor:g}x"
        trees[config] = cand = checkout_copy(ROOT, work / f"cand-{config}")
        extras[config] = {k: calibrate(base, cand, k, factor)[0] for k in kernels}
        inject(cand, extras[config])  # every kernel at its calibrated extra, then measured
        alone[config] = {}
        for kernel in kernels:
            for method, size in KERNELS[kernel].cases or (("probe", "64KiB"),):
                key = case_id(method, size) if method != "probe" else "probe"
                alone[config][key] = measure_alone(base, cand, kernel, size)
        print(f"{config}: alone " + ", ".join(f"{k} {v:.2f}x" for k, v in alone[config].items()),
              flush=True)
    run_args = ["--processes", str(args.processes), "--budget", args.budget]
    results: dict[str, list[dict[str, bool]]] = {config: [] for config in trees}
    exits: dict[str, list[int]] = {config: [] for config in trees}
    rounds_started = time.time()
    for pair in range(args.pairs):  # round by round: a drift of the box spreads over all
        if pair == 1:
            per_round = time.time() - rounds_started
            print(f"one round took {per_round:.0f} s: about {per_round * args.pairs / 60:.0f} "
                  "min for the pairs in all", flush=True)
        for config, cand in trees.items():
            begun = time.time()
            report = take_turns(base, cand, work / "store", plugin_dir, run_args)
            results[config].append(caught(report))
            exits[config].append(report["exit"])
            hits = [c for c, hit in results[config][-1].items() if hit]
            print(f"pair {pair + 1}/{args.pairs} {config} ({time.time() - begun:.0f} s, "
                  f"{time.time() - started:.0f} s in all): exit {report['exit']}, caught "
                  f"{', '.join(hits) or 'nothing'}; {report['summary']}", flush=True)
    wall = time.time() - started
    summary = {"kernels": kernels, "factors": factors, "pairs": args.pairs,
               "run_args": run_args, "alone": alone, "extra_work": extras,
               "rows": tally(results), "exits": exits,
               "wall_s": wall, "load_average": os.getloadavg(), "cpus": os.cpu_count()}
    (args.json or work / "curve.json").write_text(json.dumps(summary, indent=1))
    print(f"\ndetection curve, {time.strftime('%Y-%m-%d %H:%M')}, {args.pairs} pairs a tree, "
          f"--processes {args.processes} --budget {args.budget}, {wall:.0f} s, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; caught / pairs (measured alone)")
    print(table(summary, factors))
    unchanged = exits["unchanged"]
    print(f"unchanged pairs: exit 1 in {sum(e == 1 for e in unchanged)} of {len(unchanged)}")
    same_code = summary["rows"].get("probe moved, same code", {})
    print("a probe read differently on the two sides' turns with the same probe code: " +
          ", ".join(f"{config} {hit}/{pairs}" for config, (hit, pairs) in same_code.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
