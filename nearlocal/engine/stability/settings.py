"""The box's settings read back from their plain-data form (a live probe's `BoxSettings.to_dict()`
or a stored run's `inventory.box_settings`, read by probe/settings.py): described, one line per
setting, for `nearlocal probe` and the report's inventory, and judged. `unstable_settings` is the
one place that judges them: one line per setting that makes figures unstable, each with the
command an operator runs; the self-check (selfcheck.py beside this) keeps them in a run."""

from __future__ import annotations

from nearlocal.probe.settings import NOT_EXPOSED, cpulist_text

# An idle state whose exit latency is over this many us is "deep": an idle core (and, once all
# of a package's cores are idle, its uncore and memory path) takes that long to answer again.
# `cpupower idle-set -D 10` disables exactly these; C1 / C1E / POLL / a guest's haltpoll stay.
DEEP_CSTATE_US = 10
# Governors that pin the clock at its top (userspace is whatever someone set: said, not judged)
STEADY_GOVERNORS = ("performance",)


def _groups(cpus: list[dict], key) -> dict[object, list[int]]:
    """CPUs grouped by a value of theirs (in the order first seen)."""
    groups: dict[object, list[int]] = {}
    for entry in cpus:
        groups.setdefault(key(entry), []).append(int(entry.get("cpu", 0)))
    return groups


def _deepest(entry: dict) -> dict | None:
    """The enabled idle state with the longest exit latency (the last one listed on a tie)."""
    enabled = [s for s in entry.get("idle") or [] if isinstance(s, dict) and not s.get("disabled")]
    return max(reversed(enabled), key=lambda s: s.get("latency_us") or 0, default=None)


def _mhz(khz: object) -> str:
    return f"{int(khz) / 1000:.0f}" if isinstance(khz, int | float) else "?"


def _chosen(box: dict, cpus: list[int] | None) -> list[dict]:
    entries = [e for e in box.get("cpus") or [] if isinstance(e, dict)]
    if cpus is None:
        return entries
    wanted = set(cpus)
    return [e for e in entries if e.get("cpu") in wanted] or entries


def describe_settings(box: dict, thp_pools: str | None = None) -> list[tuple[str, str]]:
    """(label, text) per setting, compact over all CPUs ("performance on 0-63"), for the probe
    printer; plain ASCII (LANG=C, piped to a file)."""
    entries = _chosen(box, None)
    lines: list[tuple[str, str]] = []
    governors = _groups(entries, lambda e: e.get("governor"))
    if not entries or set(governors) == {None}:
        lines.append(("governor", f"{NOT_EXPOSED} (no cpufreq: a guest, or no driver loaded)"))
    else:
        drivers = sorted({str(e.get("driver")) for e in entries if e.get("driver")})
        lines.append(("governor", "; ".join(
            f"{g or NOT_EXPOSED} on {cpulist_text(c)}" for g, c in governors.items())
            + (f" (driver {', '.join(drivers)})" if drivers else "")))
        limits = _groups(entries, lambda e: (e.get("min_khz"), e.get("max_khz"), e.get("hw_max_khz")))
        lines.append(("frequency", "; ".join(
            f"{_mhz(lo)}-{_mhz(hi)} MHz (part's max {_mhz(hw)}) on {cpulist_text(c)}"
            for (lo, hi, hw), c in limits.items())))
        current = [e.get("cur_khz") for e in entries if isinstance(e.get("cur_khz"), int)]
        if current:
            lines.append(("current", f"{_mhz(min(current))}-{_mhz(max(current))} MHz now "
                          f"over {len(current)} CPUs"))
    boost = box.get("boost")
    pstate = box.get("pstate") or {}
    lines.append(("turbo/boost", (NOT_EXPOSED if boost is None else
                                  f"{'on' if boost else 'off'} ({box.get('boost_source')})")
                  + "".join(f"; {name} {status}" for name, status in pstate.items())))
    siblings = sorted({tuple(e.get("siblings") or []) for e in entries if len(e.get("siblings") or []) > 1})
    smt = box.get("smt_active")
    lines.append(("SMT", (NOT_EXPOSED if smt is None else ("on" if smt else "off"))
                  + (f" (control {box.get('smt_control')})" if box.get("smt_control") else "")
                  + (f"; siblings {' '.join(cpulist_text(list(s)) for s in siblings[:8])}"
                     + (f" and {len(siblings) - 8} more pairs" if len(siblings) > 8 else "")
                     if siblings else "; no CPU shares its core")))
    thp = box.get("thp_enabled")
    lines.append(("THP", (NOT_EXPOSED if thp is None else
                          f"enabled {thp}, defrag {box.get('thp_defrag') or NOT_EXPOSED}")
                  + (f"; hugetlb {thp_pools}" if thp_pools else "")))
    balancing = box.get("numa_balancing")
    lines.append(("NUMA balancing", NOT_EXPOSED if balancing is None else
                  f"{'off' if balancing == 0 else 'on'} ({balancing})"))
    deepest = _groups(entries, lambda e: (lambda s: None if s is None else
                                          (s.get("name"), s.get("latency_us")))(_deepest(e)))
    if not entries or set(deepest) == {None}:
        lines.append(("C-states", f"{NOT_EXPOSED} (no cpuidle states)"))
    else:
        lines.append(("C-states", "deepest enabled " + "; ".join(
            f"{name} ({latency if latency is not None else '?'} us) on {cpulist_text(c)}"
            if state is not None else f"none on {cpulist_text(c)}"
            for state, c in deepest.items() for name, latency in [state or (None, None)])
            + (f" (driver {box['idle_driver']})" if box.get("idle_driver") else "")))
    isolated, nohz = box.get("isolated"), box.get("nohz_full")
    lines.append(("isolated CPUs", (NOT_EXPOSED if isolated is None else
                                    cpulist_text(isolated) or "none")
                  + "; nohz_full " + (NOT_EXPOSED if nohz is None else cpulist_text(nohz) or "none")))
    cmdline = box.get("cmdline") or {}
    lines.append(("kernel command line", " ".join(
        f"{k}={v}" if v else k for k, v in cmdline.items()) or "none of the flags that matter here"))
    return lines


def unstable_settings(box: dict | None, cpus: list[int] | None = None) -> list[str]:
    """The one verdict on the box's settings: a line per setting that makes figures unstable
    or not what they say, with the command that fixes it. `box`: BoxSettings' dict form (a run's
    `inventory.box_settings`; None or {}: a run stored before settings were read: no line);
    `cpus`: the CPUs the run may use (None: all). A setting not exposed is no finding."""
    if not isinstance(box, dict) or not box:
        return []
    entries = _chosen(box, cpus)
    lines = []
    for governor, on in _groups(entries, lambda e: e.get("governor")).items():
        if governor is not None and governor not in STEADY_GOVERNORS:
            lines.append(f"governor {governor} on CPU {cpulist_text(on)}: the core clock follows "
                         "the load, so bandwidth figures may read low and spread; "
                         "`cpupower frequency-set -g performance`")
    if box.get("boost"):
        source = str(box.get("boost_source") or "")
        fix = ("`echo 1 > /sys/devices/system/cpu/intel_pstate/no_turbo`" if "no_turbo" in source
               else "`echo 0 > /sys/devices/system/cpu/cpufreq/boost`" if source.endswith("cpufreq/boost")
               else f"`echo 0 > {source}` on every policy")
        lines.append("turbo/boost on: the core clock moves with temperature and with how many "
                     f"cores are busy, so figures drift between runs and cases; {fix}")
    thp = box.get("thp_enabled")
    if thp == "never":
        lines.append("THP never: no transparent huge pages at all, so `dram:thp` cases are skipped "
                     "and numpy's buffers get 4 KiB pages (large chases and loads read TLB misses "
                     "a box with THP does not); "
                     "`echo madvise > /sys/kernel/mm/transparent_hugepage/enabled`")
    elif thp == "always":
        lines.append("THP always: nearlocal's regions ask for their own page size (plain `dram` "
                     "refuses huge pages, `dram:thp` asks for them), but every other anonymous "
                     "buffer (numpy's, the kernels' tables) gets 2 MiB pages where the fault or "
                     "khugepaged finds them, and khugepaged collapses pages under a run; "
                     "`echo madvise > /sys/kernel/mm/transparent_hugepage/enabled`")
    if box.get("numa_balancing"):
        lines.append("automatic NUMA balancing on: the kernel unmaps pages to sample them and "
                     "migrates them between nodes under a run (a pool region's pages may move to "
                     "local memory); `echo 0 > /proc/sys/kernel/numa_balancing`")
    deep = _groups([e for e in entries if (s := _deepest(e)) is not None
                    and (s.get("latency_us") or 0) > DEEP_CSTATE_US],
                   lambda e: (_deepest(e) or {}).get("name"))
    for name, on in deep.items():
        latency = max((_deepest(e) or {}).get("latency_us") or 0 for e in entries
                      if e.get("cpu") in on)
        lines.append(f"deep C-state {name} ({latency} us to wake) enabled on CPU "
                     f"{cpulist_text(on)}: an idle core, and a package whose cores all idle, "
                     "answer late, so latency figures spread; `cpupower idle-set -D "
                     f"{DEEP_CSTATE_US}`")
    return lines
