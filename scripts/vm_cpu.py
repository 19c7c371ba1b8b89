"""Instruction selection on a CPU the development box is not (the VM rig's cpu stage,
docs/vm-rig.md): a guest booted with a CPU model that lacks AVX2, AVX-512, clflushopt, clwb and
movdir64b runs one small case of every CPU method. numba compiles for the CPU it runs on and LLVM
aborts the whole process when it cannot select an instruction, so every row must be measured
(status ok) or skipped with a reason naming the flag the CPU lacks; none may fail or crash.
TCG has no timing: the figures mean nothing and are never checked.

    vm_cpu.py run OUT      in the guest: probe, one case per CPU method, measure; OUT/cpu.json
    vm_cpu.py check OUT    on the host: the facts, one line each; exit 1 if one fails
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vm_lib import Facts, exit_fact, finish, read_json, rows, text

# what the guest's CPU must lack for the stage to prove anything (the development box has them)
LACKING = ("avx2", "avx512f", "clflushopt", "clwb", "movdir64b")
SIZE = "64KiB"  # small, and room for loaded-chase's ring and a 4 KiB burst per traffic CPU
BUDGET_S = 0.05


def cpu_methods() -> list[str]:
    """Every registered method of the cpu family, in the order they were declared."""
    from nearlocal.core.methods import load_methods

    return [m.name for m in load_methods().values() if m.marker == "cpu"]


def smallest_case(method: str, inventory):
    """The case of `method` moving the fewest bytes among the `all` suite's (a method whose input
    is not a plain size on dram: rpc's rings, a storage file); None when no suite has one."""
    from nearlocal.core.patterns import parse_pattern
    from nearlocal.core.suites import suite_cases

    cases = [c for c in suite_cases("all", inventory) if c.method == method]
    return min(cases, key=lambda c: parse_pattern(c.pattern).total_bytes, default=None)


def cases_for(inventory, settings) -> list:
    """One case per CPU method: SIZE on local DRAM, or its smallest suite case where it runs on
    other regions (a storage file) or SIZE on DRAM is not valid input for it (rpc's rings: a
    refused case would stop the whole run)."""
    from nearlocal.core.cases import Case
    from nearlocal.core.methods import get_method
    from nearlocal.engine.plan import Refuse, plan_cases

    cases = []
    for method in cpu_methods():
        case = Case(method, "dram", pattern=SIZE)
        if "host" not in get_method(method).region_spaces or isinstance(
                plan_cases([case], inventory, settings).entries[0].decision, Refuse):
            case = smallest_case(method, inventory) or case
        cases.append(case)
    return cases


def run(out: Path) -> int:
    from numba.core.registry import cpu_target

    from nearlocal.core.methods import get_method
    from nearlocal.engine.metadata import run_metadata
    from nearlocal.engine.plan import RunSettings, plan_cases
    from nearlocal.frontends.measure import measure_into
    from nearlocal.probe import probe

    inventory = probe(gpu=False)
    # what numba's JIT compiles for: (triple, CPU name, features), its cache's key
    _, llvm_cpu, features = cpu_target.target_context.codegen().magic_tuple()
    settings = RunSettings(BUDGET_S, processes=1, allow_write=True)
    cases = cases_for(inventory, settings)
    plan = plan_cases(cases, inventory, settings)
    facts = {
        "model": inventory.cpu.model,
        "flags": {flag: inventory.cpu.has(flag) for flag in inventory.cpu.flags},
        # what numba compiles for (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES, else the host's CPU)
        "llvm_cpu": llvm_cpu,
        "llvm_features": sorted(f[1:] for f in features.split(",") if f[:1] == "+"),
        "methods": {case.method: {"case": case.id, "flags": list(get_method(case.method).cpu_flags),
                                  "unavailable": get_method(case.method).unavailable(inventory)}
                    for case in cases},
    }
    (out / "cpu.json").write_text(json.dumps(facts, indent=1))
    meta = run_metadata(inventory, settings.worker_settings(inventory), "vm-cpu", processes=1,
                        max_processes=settings.max_processes, kind="run")
    _, interrupted = measure_into(plan, out / "results", meta, quiet=True)
    return 130 if interrupted else 0


def check(out: Path) -> list[str]:
    """The stage's facts; returns the ones that do not hold."""
    fact = Facts()
    exit_fact(fact, out, "cpu", "cpu: the run exits 0")
    err = text(out / "cpu.err", missing="")
    fact("LLVM ERROR" not in err and "Cannot select" not in err,
         "cpu: no LLVM error in the run's output" + ("" if "LLVM" not in err else f" ({err[-300:]})"))
    seen = read_json(out / "cpu.json")
    if not fact(bool(seen), "cpu: the guest wrote cpu.json"):
        return fact.report("vm_check: fact: ")
    flags = seen["flags"]
    present = [flag for flag in LACKING if flags.get(flag)]
    fact(not present and flags.get("rdtscp", False),
         f"cpu: the guest's CPU ({seen['model']}) has rdtscp and "
         f"lacks {', '.join(LACKING)}" + (f" (has {', '.join(present)})" if present else ""))
    targeted = [flag for flag in LACKING if flag in seen["llvm_features"]]
    fact(not targeted, f"cpu: numba compiles for {seen['llvm_cpu']} without "
         f"{', '.join(LACKING)}" + (f" (targets {', '.join(targeted)})" if targeted else ""))
    missing = {flag for flag, on in flags.items() if not on}
    by_method: dict[str, list[dict]] = {}
    for row in rows(out / "results"):
        by_method.setdefault(row["method"], []).append(row)
    for method, want in seen["methods"].items():
        found = by_method.get(method, [])
        if not found:
            fact(False, f"cpu: {method} has a row")
            continue
        row = found[0]
        reason = str(row.get("reason") or "")
        lacks = sorted(missing & set(want["flags"]))
        if lacks:
            ok = row["status"] == "skipped" and all(flag in reason for flag in lacks)
            fact(ok, f"cpu: {method} skipped naming {', '.join(lacks)}"
                 + ("" if ok else f" (saw {row['status']}: {reason[:160]})"))
        elif want["unavailable"]:
            ok = row["status"] == "skipped" and bool(reason)
            fact(ok, f"cpu: {method} skipped with its reason ({row['status']}: {reason[:100]})")
        else:
            fact(row["status"] == "ok", f"cpu: {method} measured ({row['status']}"
                 + (f": {reason[:160]}" if reason else "") + ")")
    return fact.report("vm_check: fact: ")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("run", "check"):
        sys.exit(__doc__)
    where = Path(sys.argv[2])
    if sys.argv[1] == "run":
        sys.exit(run(where))
    sys.exit(finish(check(where), "vm_check: FAILED: "))
