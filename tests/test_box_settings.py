"""The box's own settings read from sysfs / procfs (probe/settings.py) and described and judged
(engine/stability/settings.py), and how busy the box was while a run measured
(engine/stability/busy.py), each named by the self-check."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nearlocal.engine.stability.busy import (
    OTHERS_SHARE,
    BusyRecorder,
    busy_lines,
    busy_shares,
    memory_line,
    read_proc_stat,
)
from nearlocal.engine.stability.selfcheck import self_check, summary_line
from nearlocal.engine.stability.settings import describe_settings, unstable_settings
from nearlocal.probe import probe
from nearlocal.probe.settings import NOT_EXPOSED, cpulist_text, probe_settings
from nearlocal.sysroot import SysRoot, parse_cpulist
from tests.fakesys import cxl_box, untuned_settings, write

GUEST = Path(__file__).parent / "fixtures" / "guest-6.1"


@pytest.fixture
def untuned(tmp_path) -> Path:
    return untuned_settings(cxl_box(tmp_path))


def test_the_probe_reads_each_setting(untuned):
    box = probe(SysRoot(untuned), calibrate=False, gpu=False).box_settings
    assert [c.cpu for c in box.cpus] == [0, 1]
    cpu0 = box.cpus[0]
    assert (cpu0.governor, cpu0.driver, cpu0.min_khz, cpu0.max_khz, cpu0.cur_khz) == (
        "powersave", "acpi-cpufreq", 800000, 3800000, 1200000)
    assert cpu0.siblings == [0, 1] and [s.name for s in cpu0.idle] == ["POLL", "C1", "C1E", "C6"]
    assert (cpu0.idle[-1].name, cpu0.idle[-1].latency_us, cpu0.idle[-1].disabled) == ("C6", 133, False)
    assert box.boost is True and box.boost_source.endswith("cpufreq/boost")
    assert (box.smt_active, box.smt_control) == (True, "on")
    assert (box.thp_enabled, box.thp_defrag, box.numa_balancing) == ("never", "madvise", 1)
    assert box.isolated == [1] and box.nohz_full is None and box.idle_driver == "intel_idle"
    # the relevant flags only, a repeated one kept whole, nothing after `--` (init's)
    assert box.cmdline == {"mitigations": "off", "isolcpus": "1", "hugepagesz": "1G,2M",
                           "hugepages": "4,512"}
    assert probe(SysRoot(untuned), calibrate=False, gpu=False).to_dict()["box_settings"][
        "thp_enabled"] == "never"


def test_powersave_boost_and_thp_never_are_each_named_with_their_fix(untuned):
    box = probe_settings(SysRoot(untuned)).to_dict()
    lines = unstable_settings(box)
    text = "\n".join(lines)
    assert "governor powersave on CPU 0-1" in text and "cpupower frequency-set -g performance" in text
    assert "turbo/boost on" in text and "echo 0 > /sys/devices/system/cpu/cpufreq/boost" in text
    assert "THP never" in text and "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled" in text
    assert "automatic NUMA balancing on" in text and "numa_balancing" in text
    assert "deep C-state C6 (133 us to wake)" in text and "cpupower idle-set -D 10" in text
    assert len(lines) == 5
    assert all(line.isascii() for line in lines)  # LANG=C, piped to a file


def test_the_self_check_names_each_and_the_report_leads_with_it(untuned, tmp_path):
    from nearlocal.frontends.cli import main
    from tests.report_fixtures import INVENTORY, make_run, row

    inventory = probe(SysRoot(untuned), calibrate=False, gpu=False).to_dict()
    result = self_check({"inventory": inventory}, pd.DataFrame(), pd.DataFrame())
    assert result["suspect"] == []  # the figures are the box's as it is set: a note of its own
    assert len(result["settings"]) == 5
    first, second = summary_line(result).splitlines()
    assert first.startswith("self-check: ok")
    assert second.startswith("self-check: this box's settings make figures unstable: governor "
                             "powersave on CPU 0-1")
    for name in ("turbo/boost on", "THP never"):
        assert name in second
    path = make_run(tmp_path / "store", [row("load")],
                    {**INVENTORY, "box_settings": inventory["box_settings"]},
                    meta={"self_check": result})
    assert main(["report", str(path), "--markdown", str(tmp_path / "r.md")]) == 0
    text = (tmp_path / "r.md").read_text()
    lead = next(line for line in text.splitlines() if line.startswith("**"))  # the first lead line
    assert lead.startswith("**This box's settings make figures unstable: governor powersave")
    assert "THP never" in lead and "turbo/boost on" in lead


def test_a_run_judges_the_cpus_it_may_use(untuned):
    box = probe_settings(SysRoot(untuned)).to_dict()
    box["cpus"][0]["governor"] = "performance"
    assert "governor powersave on CPU 1" in "\n".join(unstable_settings(box, cpus=[1]))
    assert not any("governor" in line for line in unstable_settings(box, cpus=[0]))


def test_intel_pstate_turbo_and_thp_always(tmp_path):
    root = untuned_settings(tmp_path, governor="performance", thp="[always] madvise never")
    (root / "sys/devices/system/cpu/cpufreq/boost").unlink()
    write(root, "/sys/devices/system/cpu/intel_pstate/no_turbo", "0")
    write(root, "/sys/devices/system/cpu/intel_pstate/status", "active")
    box = probe_settings(SysRoot(root))
    assert box.boost is True and box.pstate == {"intel_pstate": "active"}
    text = "\n".join(unstable_settings(box.to_dict()))
    assert "echo 1 > /sys/devices/system/cpu/intel_pstate/no_turbo" in text
    assert "THP always" in text and "governor" not in text
    write(root, "/sys/devices/system/cpu/intel_pstate/no_turbo", "1")
    assert probe_settings(SysRoot(root)).boost is False


def test_a_tuned_box_has_no_finding(tmp_path):
    root = untuned_settings(tmp_path, governor="performance", boost="0",
                            thp="always [madvise] never")
    write(root, "/proc/sys/kernel/numa_balancing", "0")
    for cpu in (0, 1):
        write(root, f"/sys/devices/system/cpu/cpu{cpu}/cpuidle/state3/disable", "1")
    box = probe_settings(SysRoot(root)).to_dict()
    assert unstable_settings(box) == []
    described = dict(describe_settings(box))
    assert described["governor"].startswith("performance on 0-1")
    assert described["C-states"].startswith("deepest enabled C1E (10 us) on 0-1")
    assert described["SMT"] == "on (control on); siblings 0-1"


@pytest.mark.parametrize("root", [GUEST, None], ids=["recorded-guest", "fake-guest"])
def test_a_guest_without_cpufreq_says_not_exposed_and_finds_nothing(root, tmp_path):
    """A guest exposes no cpufreq, cpuidle, smt or numa_balancing: nothing judged of them (the
    recorded Debian guest runs THP `always`, Debian's default: that one is named)."""
    recorded = root is not None
    root = root or cxl_box(tmp_path)
    box = probe_settings(SysRoot(root)).to_dict()
    found = unstable_settings(box)
    assert [line.split(":")[0] for line in found] == (["THP always"] if recorded else [])
    described = dict(describe_settings(box))
    for label in ("governor", "turbo/boost", "SMT", "NUMA balancing", "C-states"):
        assert described[label].startswith(NOT_EXPOSED), label
    assert unstable_settings(None) == [] and unstable_settings({}) == []  # an older run


def test_probe_prints_the_block_and_json_carries_it(untuned, monkeypatch, capsys):
    import json

    from nearlocal.frontends.cli import main

    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(untuned))
    monkeypatch.setenv("LANG", "C")
    assert main(["probe"]) == 0
    out = capsys.readouterr().out
    assert "box settings" in out and "governor: powersave on 0-1 (driver acpi-cpufreq)" in out
    assert "unstable governor powersave on CPU 0-1" in out
    assert main(["probe", "--json"]) == 0
    box = json.loads(capsys.readouterr().out)["inventory"]["box_settings"]
    assert box["cpus"][0]["governor"] == "powersave" and box["boost"] is True


def test_cpulist_text_is_what_parse_cpulist_reads():
    assert cpulist_text([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert cpulist_text([]) == ""


@given(st.lists(st.integers(0, 300), max_size=40))
def test_cpulist_text_round_trips(cpus):
    assert parse_cpulist(cpulist_text(cpus)) == sorted(set(cpus))


# ---------------------------------------------------------------- how busy the box was


def _record(cpus: dict[int, tuple[float, float]], wall_s: float = 10.0, hz: int = 100,
            self_cpu_s: float = 0.0) -> dict:
    """A run's `busy` over wall_s: per CPU (share the run's threads held, share other work
    held); the run's CPU time is what its shares add up to, seen where it ran."""
    ticks = int(wall_s * hz)
    start, end, where = [], [], []
    for cpu, (own, others) in cpus.items():
        busy = round((own + others) * ticks)
        start.append([1000] * 10)
        end.append([1000 + busy, 1000, 1000, 1000 + ticks - busy, 1000, 1000, 1000, 1000, 1000,
                    1000])
        if own:
            where.append([cpu, round(own * 1000)])
    own_s = sum(w for _, w in where) / 1000 * wall_s
    return {"wall_s": wall_s, "clock_ticks_per_s": hz, "cpus": list(cpus), "stat_start": start,
            "stat_end": end, "self_cpu_s": self_cpu_s, "children_cpu_s": 0.0,
            "tree_cpu_s": own_s, "allowed_cpus": list(cpus), "samples": 200, "where": where}


def test_a_hog_on_the_other_cpu_is_named():
    lines = busy_lines(_record({0: (0.0, 0.97), 1: (1.0, 0.0)}))
    assert lines == ["CPU 0 was 97 % busy with other work while this run measured: figures may "
                     "be slow or spread"]
    result = self_check({"busy": _record({0: (0.0, 0.97), 1: (1.0, 0.0)})}, pd.DataFrame(),
                        pd.DataFrame())
    assert result["suspect"] == lines and not result["checks"]["busy"]["ok"]
    assert summary_line(result).startswith("self-check: these figures are suspect: CPU 0 was 97 %")


def test_a_quiet_box_and_the_runs_own_processes_are_no_busy_box():
    assert busy_lines(_record({0: (0.0, 0.03), 1: (1.0, 0.0)})) == []
    # the run on both CPUs (a threaded method, or its worker moved): its own time explains both
    assert busy_lines(_record({0: (0.6, 0.02), 1: (0.9, 0.05)})) == []
    result = self_check({"busy": _record({0: (0.0, 0.03), 1: (1.0, 0.0)})}, pd.DataFrame(),
                        pd.DataFrame())
    assert result["suspect"] == [] and result["checks"]["busy"]["ok"]


def test_a_hog_the_scheduler_moves_between_cpus_is_named_for_the_box():
    (line,) = busy_lines(_record({0: (0.5, 0.48), 1: (0.5, 0.47)}))
    assert line.startswith("processes other than this run kept 0.95 CPUs busy on average")


def test_the_smt_sibling_of_the_timed_cpu():
    record = _record({0: (0.0, 0.9), 1: (1.0, 0.0), 2: (0.0, 0.0), 3: (0.0, 0.0)})
    (line,) = busy_lines(record, {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]})
    assert line.startswith("CPU 0 (the SMT sibling of CPU 1, where this run measured) was 90 % busy")


def test_steal_and_a_short_run():
    record = _record({0: (1.0, 0.0)})
    record["stat_end"][0][7] += 500  # the hypervisor took a third of the span
    assert busy_lines(record) == ["CPU 0 lost 33 % of the run to the hypervisor (steal): figures "
                                  "may be slow or spread"]
    assert busy_lines(_record({0: (0.0, 1.0)}, wall_s=0.2)) == []  # 20 ticks: too few to judge
    assert busy_lines(None) == [] and busy_lines({}) == [] and busy_shares({"cpus": 3}) == {}


def test_the_memory_probe_moving_under_the_run():
    fact = {"tsc_hz": 1e9, "hops": 1, "overhead_ticks": 0.0}
    probe_of = lambda *medians: {"probes": {"memory": fact},  # noqa: E731
                                 "passes": [{"pass": i, "memory": [m] * 5} for i, m in enumerate(medians)]}
    assert memory_line(probe_of(264, 270, 262)) is None
    assert memory_line(probe_of(264, 300, 380)).startswith(
        "the host's memory latency moved 1.44x slower from the run's start to its end "
        "(memory probe 264 -> 380 ns a hop)")
    assert memory_line(probe_of(264)) is None and memory_line(None) is None
    result = self_check({"host_probe": probe_of(380, 264)}, pd.DataFrame(), pd.DataFrame())
    assert "1.44x faster" in result["suspect"][0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1, max_size=8),
       st.integers(1, 10), st.integers(0, 99))
def test_a_cpu_busy_only_with_the_run_is_never_named(shares, seconds, background):
    """Whatever the run's threads held of each CPU (where it was seen), a CPU whose other work
    stays under the threshold is never named, however busy the run kept it."""
    cpus = {}
    for cpu, (own, other) in enumerate(shares):
        own_share = own / 1000
        others = min(1.0 - own_share, other / 1000 * background / 100 * OTHERS_SHARE * 0.9)
        cpus[cpu] = (own_share, others)
    lines = busy_lines(_record(cpus, wall_s=float(seconds)))
    assert not any("% busy with other work" in line for line in lines)
    if background == 0:
        assert lines == []


def test_proc_stat_and_a_real_recording(tmp_path):
    write(tmp_path, "/proc/stat", "cpu  10 0 5 100 0 0 0 0 0 0\ncpu0 4 0 2 50 0 0 0 0 0 0\n"
                                  "cpu1 6 0 3 50 0 0 0 0 0 0\nintr 1 2\nctxt 3")
    assert read_proc_stat(SysRoot(tmp_path)) == {0: [4, 0, 2, 50, 0, 0, 0, 0, 0, 0],
                                                 1: [6, 0, 3, 50, 0, 0, 0, 0, 0, 0]}
    recorder = BusyRecorder(interval_s=0.01)
    recorder.start()
    sum(i * i for i in range(200_000))
    record = recorder.stop()
    assert record["cpus"] and len(record["stat_start"]) == len(record["cpus"])
    assert record["wall_s"] > 0 and record["tree_cpu_s"] >= 0 and record["samples"] >= 0
    assert set(busy_shares(record)) <= set(record["cpus"])
    assert isinstance(busy_lines(record), list)


def test_the_reports_inventory_lists_the_box_settings(untuned, tmp_path):
    """Issue 56: the report's inventory listed no settings; now each as `probe` lists it."""
    from nearlocal.report.sections.inventory import _settings_rows
    from nearlocal.report.tables import build_report
    from nearlocal.store import load
    from tests.report_fixtures import INVENTORY, make_run, row

    box = probe(SysRoot(untuned), calibrate=False, gpu=False).to_dict()["box_settings"]
    old = make_run(tmp_path, [row("load")], run_id="old")  # stored before settings were read
    new = make_run(tmp_path, [row("load")], {**INVENTORY, "box_settings": box}, run_id="new")
    report = build_report([load(old), load(new)])
    (inventory,) = [s for s in report.sections if s.key == "inventory"]
    rows = {r[0]: r[1:] for r in inventory.table.rows}
    for label, text in describe_settings(box):
        assert rows[f"settings: {label}"][1] == text
    assert rows["settings: governor"][1].startswith("powersave on 0-1")
    assert "not recorded" in rows["settings"][0]
    assert "unreadable" in _settings_rows({"pstate": ["damaged"]})["settings"]
