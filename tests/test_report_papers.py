"""Issue 56: the report quotes the papers exactly and sets beside a paper's bandwidth only rows
that reached memory. B12's peaks (and S2's) come from rows with `reaches_memory`; a cache's peak
stands apart, labelled the cache's; the rack's aggregate is compared with nothing (the paper's
1 TB/s is its switch box's stated total); B14's "16 such tokens" is said to be a reading."""

from __future__ import annotations

import pytest

from nearlocal.report.papers import figure, statement
from nearlocal.report.tables import build_report
from nearlocal.store.reader import load
from tests.report_fixtures import make_run, row

POOL = "devdax:/dev/dax0.0"
KIB, MIB = 1024, 2**20


def _report(tmp_path, rows):
    return build_report([load(make_run(tmp_path, rows))])


def _b12(report) -> dict[tuple[str, str], list]:
    return {(r[0], r[1]): r[2:] for r in report.section("b12").table.rows}


@pytest.fixture(scope="module")
def cached_and_memory(tmp_path_factory):
    """Local loads: 16 KiB stays in a cache at 133 GB/s, 1 GiB reaches memory at 12 GB/s; the
    pool's loads reach memory at every size; a GPU copy from the pool (its rows do not say)."""
    rows = [
        row("load", "dram", size=16 * KIB, median=16 * KIB / 133, reaches_memory=False),
        row("load", "dram", size=4 * MIB, median=4 * MIB / 60, reaches_memory=False,
            llc_resident=True),
        row("load", "dram", size=2**30, median=2**30 / 12, reaches_memory=True),
        row("load", "numa:1", size=16 * KIB, median=16 * KIB / 9, reaches_memory=True),
        row("memcpy", "dram", size=16 * KIB, median=16 * KIB / 80, reaches_memory=False),
        row("cuda-memcpy", POOL, size=64 * MIB, peer="gpu:0", median=64 * MIB / 20,
            marker="gpu"),  # no cache facts: stored before rows carried them
    ]
    return _report(tmp_path_factory.mktemp("b12"), rows)


def test_b12_peak_is_from_rows_that_reached_memory(cached_and_memory):
    local = _b12(cached_and_memory)[("load", "dram -> dram")]
    assert local[0] == pytest.approx(12) and local[1] == 2**30  # not the cache's 133 GB/s
    assert local[3] == "133 GB/s at 16KiB, in a CPU cache"  # the cache's, labelled so


def test_b12_a_path_that_never_reached_memory_has_no_bandwidth(cached_and_memory):
    copy = _b12(cached_and_memory)[("memcpy", "dram -> dram")]
    assert copy[0].reason.startswith("no row reached memory") and copy[2] is None
    assert copy[3] == "80 GB/s at 16KiB, in a CPU cache"


def test_b12_rows_without_the_fact_count_as_reaching_memory_and_say_so(cached_and_memory):
    section = cached_and_memory.section("b12")
    gpu = _b12(cached_and_memory)[("cuda-memcpy", f"{POOL} -> gpu:0")]
    assert gpu[0] == pytest.approx(20) and gpu[2] == pytest.approx(20 / 26)
    assert any("1 rows were stored without `reaches_memory`" in n for n in section.notes)
    headers = [c.name for c in section.table.columns]
    assert "peak GB/s (reached memory)" in headers and "× 26 GB/s cap" in headers


def test_the_bandwidth_plot_labels_cache_resident_series(cached_and_memory):
    plot = cached_and_memory.section("b12").plots[0]
    labels = {s.label: s.x for s in plot.series}
    assert labels["load dram -> dram"] == (2.0**30,)
    assert labels["load dram -> dram, in a CPU cache (not the path's)"] == (16 * KIB, 4 * MIB)
    lines = [line.label for line in plot.lines]
    assert "B12 per CXL adapter 26 GB/s" in lines and "S2 NVLink ~600 GB/s" in lines
    assert not any("TB/s" in label or "16 servers" in label for label in lines)


def test_s2_takes_no_cache_peak_for_a_medium(tmp_path):
    rows = [row("cuda-memcpy", "pinned", size=64 * MIB, peer="gpu:0", median=64 * MIB / 50,
                marker="gpu", reaches_memory=False)]  # made up: a row said to stay cached
    s2 = _report(tmp_path, rows).section("s2").table
    host = next(r for r in s2.rows if r[0].startswith("Host DRAM"))
    assert host[1] == "~16 GB/s (S2)"
    assert host[2].reason.startswith("no row reached memory (the cache's peak: 50 GB/s")


def test_the_rack_section_compares_no_aggregate_with_the_switch_box(tmp_path):
    aggregate = row("rack-aggregate", "shm:nearlocal-rack", size=16 * MIB, median=1e6,
                    marker="rack")
    aggregate.update(case_id=aggregate["case_id"] + "/rank=0", host="box-a",
                     info={"together_gbps": 8.0, "alone_gbps": 10.0, "total_gbps": 16.0,
                           "share": 0.5, "ranks": 2})
    section = _report(tmp_path, [aggregate]).section("rack")
    switch = statement("beluga-switch")
    assert "1 TB/s for up to 16 servers is a ceiling stated by the vendor/paper" in section.intro
    assert "no × paper" in section.intro and switch not in section.refs
    (cells,) = [r for r in section.table.rows if r[0].startswith("aggregate")]
    columns = [c.name for c in section.table.columns]
    assert cells[columns.index("× paper")] is None
    assert "total 16.00 GB/s over 2 ranks" in cells[columns.index("note")]


def test_b14_sixteen_reads_are_said_to_be_a_reading(tmp_path):
    rows = [row("load", "shm:kv", size=1024 * 160, fragments=1024, median=50000),
            row("load", "shm:kv", size=256 * 160, fragments=256, median=14000)]
    section = _report(tmp_path, rows).section("b13")
    assert '"fetching 16 such tokens", read here as 16 reads of 1,024 x 160 B each ' \
           "(nearlocal's reading" in section.intro
    (point,) = section.plots[0].points
    assert point.label.startswith('B14 CXL 211 us for "fetching 16 such tokens"')
    assert "(nearlocal's reading)" in point.label and point.x == 16 * 1024


def test_quotes_keep_the_papers_digits_and_qualifiers():
    b12 = figure("B12")
    assert b12.value("serving throughput gain").text() == "+33.2%"
    assert [v.name for v in b12.values if v.unit in ("GB/s", "TB/s")] == [
        "per CXL adapter", "per pool memory device"]
    assert figure("B14").value("RDMA").text() == "5,260 us"
    assert figure("B3").value("256-token superblocks").text() == "13.0 s"
    assert figure("B10").value("below size").text() == "< 24 KB"
    assert figure("B4").value("dual 200 Gbps NIC").text() == "$1,745"


def test_the_references_name_the_stated_switch_figure_apart():
    from nearlocal.report.sections.inventory import section_references

    section = section_references()
    assert not any("TB/s" in str(cell) for r in section.table.rows for cell in r)
    (note,) = section.notes
    assert note.startswith("Stated, not measured (Beluga), so compared with nothing: CXL switch")
    assert "1 TB/s aggregate" in note and "stated by the vendor/paper" in note
