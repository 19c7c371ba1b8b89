"""B7 compares the paper's single-operation figures with isolated (drain=before) rows only."""

from __future__ import annotations

from nearlocal.report.tables import build_report
from nearlocal.store import load
from tests.report_fixtures import make_run, row


def test_b7_compares_isolated_rows_and_says_so(tmp_path):
    pool = "devdax:/dev/dax0.0"
    rows = [
        row("nt-store", pool, access="write", median=2000.0),
        # a back-to-back row on the same pool: faster to pick by rank, but not what B7 compares
        row("nt-store", pool, access="write", median=7000.0, params={"drain": "none"}),
        row("nt-copy", pool, access="write", median=2500.0, params={"drain": "before"}),
        row("nt-copy", pool, access="write", median=9000.0, params={"drain": "none"}),
    ]
    section = build_report([load(make_run(tmp_path, rows))]).section("b7")
    b7a = {r[1]: r for r in section.table.rows if r[0] == "B7a"}
    assert b7a["nt-store, wb"][3].median_ns == 2000.0
    assert b7a["nt-copy, wb"][3].median_ns == 2500.0  # an explicit drain=before counts too
    assert any("drain=before" in note and "drain=none" in note for note in section.notes)


def test_b7_without_isolated_rows_says_none_is_there(tmp_path):
    rows = [row("nt-store", "dram", access="write", median=7000.0, params={"drain": "none"})]
    section = build_report([load(make_run(tmp_path, rows))]).section("b7")
    b7a = next(r for r in section.table.rows if r[1] == "nt-store, wb")
    assert "no nt-store wb 16KiB row" in b7a[3].reason


def test_b8_leaves_back_to_back_rows_out(tmp_path):
    pool = "devdax:/dev/dax0.0"
    rows = [row("dsa-memmove", pool, size=4096, access="write", median=900.0, marker="dsa"),
            row("nt-store", pool, size=4096, access="write", median=50.0,
                params={"drain": "none"}),
            row("dsa-memmove", pool, size=8192, access="write", median=1200.0, marker="dsa"),
            row("nt-store", pool, size=8192, access="write", median=1500.0)]
    table = build_report([load(make_run(tmp_path, rows))]).section("b8").table
    cells = {r[0]: r for r in table.rows}
    assert cells[4096][1].reason == "not in this run"  # the drain=none row is not shown
    assert cells[8192][1].median_ns == 1500.0
