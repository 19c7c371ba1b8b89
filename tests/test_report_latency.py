"""The report's idle-latency (local vs pool) and loaded-latency sections, from synthetic rows."""

from __future__ import annotations

from nearlocal.report.render_html import report_html
from nearlocal.report.tables import NoValue, Stat, build_report
from nearlocal.store import load
from tests.report_fixtures import make_run, row

GiB = 1 << 30


def _chase(region: str, size: int, median: float, pages: str = "4K") -> dict:
    data = row("chase", region, size=size, median=median)
    data["info"] = {"page_size": pages}
    data["gbps"] = float("nan")
    return data


def _loaded(region: str, delay: int, gbps: float, median: float) -> dict:
    data = row("loaded-chase", region, size=GiB, median=median, params={"delay": str(delay)})
    data["info"] = {"traffic": "load", "traffic_threads": 3, "traffic_gbps": gbps,
                    "delay_ns": delay}
    return data


def _report(tmp_path, rows):
    return build_report([load(make_run(tmp_path, rows))])


def test_idle_latency_puts_the_pool_beside_local(tmp_path):
    rows = [_chase("dram", GiB, 100.0), _chase("numa:1", GiB, 290.0),
            _chase("dram:2M", GiB, 80.0, "2M"), _chase("dram", 16384, 1.5),
            row("chase", "devdax:/dev/dax0.0", size=GiB, status="skipped",
                reason="writes to devdax:/dev/dax0.0 need --allow-write", median=None)]
    section = _report(tmp_path, rows).section("idle")
    frame = section.table.frame().set_index(["ring", "region"])
    pool = frame.loc[(GiB, "numa:1")]
    assert pool["what"].startswith("CPU-less NUMA node") and pool["pages"] == "4K"
    assert isinstance(pool["ns per load (p10–p90)"], Stat)
    assert pool["local dram"] == 100.0 and pool["÷ local"] == 2.9
    assert pool["+ over local"] == 190.0
    assert frame.loc[(GiB, "dram:2M")]["pages"] == "2M"
    skipped = frame.loc[(GiB, "devdax:/dev/dax0.0")]["ns per load (p10–p90)"]
    assert isinstance(skipped, NoValue) and "--allow-write" in skipped.reason
    assert frame.index.get_level_values(0)[0] == 16384  # by ring size
    assert {s.label for s in section.plots[0].series} == {"dram", "numa:1", "dram:2M"}
    assert "÷ local" in report_html(_report(tmp_path / "again", rows))


def test_loaded_latency_curve_per_region(tmp_path):
    rows = [_loaded(region, delay, gbps, ns) for region, scale in (("dram", 1.0), ("numa:1", 2.0))
            for delay, gbps, ns in ((0, 20.0, 180.0), (1000, 5.0, 120.0), (10000, 0.5, 100.0))
            for gbps, ns in [(gbps / scale, ns * scale)]]
    section = _report(tmp_path, rows).section("loaded")
    frame = section.table.frame()
    assert len(frame) == 6 and list(frame["region"][:3]) == ["numa:1"] * 3  # pool first
    assert list(frame["delay ns"][:3]) == [0, 1000, 10000]
    curves = {s.label: s for s in section.plots[0].series}
    assert curves["numa:1 (load traffic)"].x == (0.25, 2.5, 10.0)  # sorted by bandwidth
    assert curves["numa:1 (load traffic)"].y == (200.0, 240.0, 360.0)
    assert not section.plots[0].x_is_size


def test_sections_say_why_when_empty(tmp_path):
    report = _report(tmp_path, [row("load", "dram")])
    assert "no chase rows" in report.section("idle").absent
    assert "no loaded-chase rows" in report.section("loaded").absent


def test_threads_section_puts_n_threads_beside_one(tmp_path):
    one = row("load", "numa:1", size=GiB, median=GiB / 10.0)  # 10 GB/s
    many = row("load", "numa:1", size=GiB, median=GiB / 25.0, params={"threads": "all"})
    many["info"] = {"threads": 3, "per_thread": [{"gbps": 8.0}, {"gbps": 8.5}, {"gbps": 9.25}]}
    failed = row("store", "numa:1", size=GiB, status="failed", median=None,
                 reason="3 threads need 3 distinct CPUs", params={"threads": "3"})
    section = _report(tmp_path, [one, many, failed]).section("threads")
    frame = section.table.frame().set_index("method")
    assert frame.loc["load", "threads"] == 3 and frame.loc["load", "GB/s"] == 25.0
    assert frame.loc["load", "1 thread GB/s"] == 10.0 and frame.loc["load", "× 1 thread"] == 2.5
    assert frame.loc["load", "per thread GB/s"] == "8.00–9.25"
    assert isinstance(frame.loc["store", "GB/s"], NoValue)
    assert "no --threads rows" in _report(tmp_path / "b", [one]).section("threads").absent
