#!/usr/bin/env bash
# Does the CI regression gate (`nearlocal compare`) hold on this box? Measures, at default
# settings, three runs of the quick suite on unchanged code and two with a REAL 1.3x slowdown of
# the test-only plugin methods gate-load and gate-chase (tests/gate_plugin.py: their compiled
# kernels do 1.3x the passes or hops per sample, the figure per nominal one), then compares
# every pair:
#   unchanged pairs: exit 0, at least 70% of compared cases `same`, no case `slower`;
#   unchanged -> slowed pairs: at least 90% of the gate-* cases `slower`, and
#   gate-chase/dram/wb/1GiB `slower` in every pair.
# Every run carries the plugin's cases (the unchanged runs at slowdown 1.0), so each pair
# compares the same case list. Prints the load average with the figures: the box is shared.
# The five runs take turns, pass by pass (`nearlocal run --take-turns`), as a CI job measures
# its baseline and candidate; GATE_TURNS=0 runs them one after another instead (a candidate
# against a baseline stored earlier: the host may move between them).
#
#   bash scripts/gate_check.sh [STORE]        (default: a new temporary directory)
#   GATE_TURNS=0 bash scripts/gate_check.sh [STORE]   the runs one after another
#   GATE_REUSE=1 bash scripts/gate_check.sh STORE   compares the runs already in STORE
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
store=${1:-$(mktemp -d /tmp/nearlocal-gate.XXXXXX)}
nearlocal=${NEARLOCAL:-nearlocal}
[ -x "$root/.venv/bin/nearlocal" ] && nearlocal=${NEARLOCAL:-$root/.venv/bin/nearlocal}
python=python3
[ -x "$root/.venv/bin/python" ] && python=$root/.venv/bin/python
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" NEARLOCAL_PLUGINS=tests.gate_plugin
mkdir -p "$store"
echo "store: $store; load average at start: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs"

kinds=(same same same slow slow)
factor() { if [ "$1" = slow ]; then echo 1.3; else echo 1.0; fi; }
if [ "${GATE_REUSE:-0}" = 1 ]; then
    :
elif [ "${GATE_TURNS:-1}" = 1 ]; then
    # the five runs take turns pass by pass (nearlocal run --take-turns): one host for all
    start=$(date +%s)
    pids=()
    for i in "${!kinds[@]}"; do
        NEARLOCAL_GATE_SLOWDOWN=$(factor "${kinds[$i]}") "$nearlocal" run --out "$store" --quiet \
            --take-turns "$store/turns" --turn "$i/${#kinds[@]}" > "$store/.run-$i" 2>&1 &
        pids+=($!)
    done
    for i in "${!kinds[@]}"; do
        wait "${pids[$i]}" || { cat "$store/.run-$i" >&2; exit 1; }
        id=$(sed -n 's#^stored .*/##p' "$store/.run-$i" | tail -1)
        echo "${kinds[$i]} $id" >> "$store/gate-runs.txt"
        echo "run $id (slowdown $(factor "${kinds[$i]}"), arm $i of ${#kinds[@]} taking turns)"
    done
    echo "the five runs, taking turns: $(( $(date +%s) - start )) s," \
         "load average $(cut -d' ' -f1-3 /proc/loadavg)"
else
    for kind in "${kinds[@]}"; do
        start=$(date +%s)
        NEARLOCAL_GATE_SLOWDOWN=$(factor "$kind") "$nearlocal" run --out "$store" --quiet \
            > "$store/.last-run"
        id=$(sed -n 's#^stored .*/##p' "$store/.last-run" | tail -1)
        echo "$kind $id" >> "$store/gate-runs.txt"
        echo "run $id (slowdown $(factor "$kind")): $(( $(date +%s) - start )) s," \
             "load average $(cut -d' ' -f1-3 /proc/loadavg)"
    done
fi

NEARLOCAL="$nearlocal" STORE="$store" "$python" - <<'EOF'
import itertools
import json
import os
import statistics
import subprocess
import sys

import pandas

from nearlocal.harness.hostprobe import per_hop_ns

store, nearlocal = os.environ["STORE"], os.environ["NEARLOCAL"]
runs = [line.split() for line in open(os.path.join(store, "gate-runs.txt"))]
same = [run for kind, run in runs if kind == "same"]
slow = [run for kind, run in runs if kind == "slow"]


def compare(base: str, cand: str) -> tuple[int, dict]:
    done = subprocess.run([nearlocal, "compare", base, cand, "--out", store, "--format", "json"],
                          capture_output=True, text=True)
    if done.returncode not in (0, 1):
        sys.exit(f"compare {base} {cand} failed: {done.stderr.strip()}")
    return done.returncode, json.loads(done.stdout)


ok = True
print("unchanged pairs (need: exit 0, >= 70% same, no slower):")
for base, cand in itertools.combinations(same, 2):
    code, report = compare(base, cand)
    counts = report["counts"]
    compared = sum(counts[v] for v in ("slower", "faster", "ambiguous", "same"))
    share = counts["same"] / max(compared, 1)
    good = code == 0 and share >= 0.70 and counts["slower"] == 0
    ok &= good
    print(f"  {base} -> {cand}: exit {code}, {counts['same']}/{compared} same ({share:.0%}), "
          f"{counts['slower']} slower, {counts['faster']} faster, {counts['ambiguous']} ambiguous"
          f"{'' if good else '  FAIL'}")
    for case in report["cases"]:
        if case["verdict"] == "slower":
            print(f"    slower: {case['case_id']} {case['ratio']:.3f}x "
                  f"[{case['ci_low']:.3f}, {case['ci_high']:.3f}]")
    print(f"    {report['summary']}")

print("unchanged -> slowed 1.3x pairs (need: >= 90% of gate-* slower over the pairs, "
      "gate-chase 1GiB slower in each):")
caught = total = 0
for base, cand in itertools.product(same, slow):
    code, report = compare(base, cand)
    gate = [c for c in report["cases"] if c["case_id"].startswith("gate-")]
    hits = [c for c in gate if c["verdict"] == "slower"]
    chase = next(c for c in gate if c["case_id"] == "gate-chase/dram/wb/1GiB")
    caught, total = caught + len(hits), total + len(gate)
    ok &= chase["verdict"] == "slower"
    others = [c for c in report["cases"] if not c["case_id"].startswith("gate-")
              and c["verdict"] == "slower"]
    print(f"  {base} -> {cand}: exit {code}, {len(hits)}/{len(gate)} gate cases slower; "
          f"chase 1GiB {chase['verdict']} {chase['ratio']:.3f}x; "
          f"{len(others)} unchanged cases slower")
    for c in gate:
        if c["verdict"] != "slower":
            interval = ("no interval" if c["ci_low"] is None or c["ci_high"] is None
                        else f"[{c['ci_low']:.3f}, {c['ci_high']:.3f}]")
            ratio = "no ratio" if c["ratio"] is None else f"{c['ratio']:.3f}x"
            print(f"    missed: {c['case_id']} {c['verdict']} {ratio} {interval} {c['note'] or ''}")
share = caught / max(total, 1)
ok &= share >= 0.90
print(f"caught {caught}/{total} = {share:.0%} of the slowed cases over the pairs")

# What the box did between the runs, told apart from what the code did: the unchanged 1 GiB
# chase per run (host memory drift), and within each run the gate-* / unchanged-method ratio of
# the same case (the slowdown itself, measured in one run's time).
print("the host between runs (no part of the verdict):")
for kind, run in runs:
    cases = pandas.read_parquet(os.path.join(store, run, "cases.parquet"))
    ok_rows = cases[cases["status"] == "ok"].set_index("case_id")["median_ns"]
    within = [ok_rows[cid] / ok_rows[cid[len("gate-"):]] for cid in ok_rows.index
              if cid.startswith("gate-") and cid[len("gate-"):] in ok_rows.index]
    chase = ok_rows.get("chase/dram/wb/1GiB", float("nan"))
    spread = f"{min(within):.2f}-{max(within):.2f}" if within else "none"
    with open(os.path.join(store, run, "run.json")) as meta:
        host = json.load(meta).get("host_probe") or {}
    passes, facts = host.get("passes", []), host.get("probes", {})
    probes = "; ".join(
        f"{name} probe "
        f"{statistics.median(statistics.median(per_hop_ns(facts[name], p[name])) for p in passes):.4g} ns"
        for name in ("core", "llc", "memory") if passes and all(name in p for p in passes))
    print(f"  {kind} {run}: chase 1GiB {chase:.0f} ns; {probes or 'no host probes'}; "
          f"gate-*/unchanged in the run: median "
          f"{statistics.median(within) if within else float('nan'):.2f} ({spread}, "
          f"{len(within)} cases)")
print(f"load average at the end: {open('/proc/loadavg').read().split()[:3]}")
print("gate check:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
EOF
