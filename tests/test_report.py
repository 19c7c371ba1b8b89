"""`nearlocal report`: the right rows, values, ratios and reasons in every output, on synthetic
runs written through the real store."""

from __future__ import annotations

import re

import pytest

from nearlocal.acceptance.verdicts import AcceptanceRecord, VerdictRecord, store_acceptance
from nearlocal.frontends.cli import main
from nearlocal.regions.base import pool_class_of
from nearlocal.report.document import Column
from nearlocal.report.fmt import cell_text
from nearlocal.report.papers import figure, figures
from nearlocal.report.render_html import report_html, table_html, write_html
from nearlocal.report.render_markdown import table_markdown, write_markdown
from nearlocal.report.rows import class_rank
from nearlocal.report.tables import (
    NoValue,
    Stat,
    build_report,
    crossover_size,
)
from nearlocal.store import load
from tests.report_fixtures import (
    CPU_ONLY_INVENTORY,
    UC_REASON,
    cpu_only_rows,
    full_rows,
    make_run,
    row,
)

SECTION_KEYS = ["near", "idle", "runs", "b7", "b8", "b9", "b11", "b12", "b13", "b15", "rdma", "s2", "s3",
                "serving", "serving-load", "claims", "near-cases", "threads", "loaded", "rack", "inventory",
                "failures", "skipped", "references"]


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    run = load(make_run(root, full_rows()))
    return build_report([run])


@pytest.fixture(scope="module")
def cpu_only(tmp_path_factory):
    root = tmp_path_factory.mktemp("cpu")
    return build_report([load(make_run(root, cpu_only_rows(), CPU_ONLY_INVENTORY))])


def _row(table, first: str) -> list:
    return next(r for r in table.rows if r[0] == first)


# --- reference data --------------------------------------------------------------------------

def test_every_paper_figure_is_present_with_units_and_provenance():
    expected = {"B1", "B2", "B3", "B4", "B7a", "B7b", "B7c", "B7d", "B7e", *(
        f"B{i}" for i in range(8, 17)), *(f"S{i}" for i in range(1, 6))}
    assert set(figures()) == expected
    for fig in figures().values():
        assert fig.provenance == "reported by the paper"
        assert fig.paper.arxiv in ("2511.20172", "2606.16135")
        assert fig.what and fig.text
        for value in fig.values:
            assert value.unit
    assert figure("B7a").value().ns() == pytest.approx(2410)
    assert figure("B7e").value().ns() == pytest.approx((1690 + 2120) / 2)
    assert figure("B15").value("throughput at qd 128").central == pytest.approx(12.13)
    assert figure("S2").value("NVLink").unit == "GB/s"
    assert figure("B8").value("CPU wins below").bytes() == 4096


def test_region_classes_rank_the_pool_first():
    ranks = [class_rank(pool_class_of(r, frozenset({1}))) for r in
             ("devdax:/dev/dax0.0", "numa:1", "numa:0", "shm:x", "dram", "gpu:0")]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    assert class_rank(pool_class_of("registered:devdax:/dev/dax0.0")) == 0


def test_crossover_from_data():
    sizes = [1024, 4096, 8192, 65536]
    assert crossover_size(sizes, [1, 4, 15, 90], [9, 10, 12, 40]) == 8192
    assert crossover_size(sizes, [1, 1, 1, 1], [2, 2, 2, 2]) is None
    assert crossover_size(sizes, [5, 5, 5, 5], [1, 1, 1, 1]) == 1024
    # DSA wins at 4 KiB but loses at 8 KiB: the crossover is where it wins for good
    assert crossover_size(sizes, [1, 9, 1, 90], [2, 2, 2, 40]) == 65536


# --- the rows ----------------------------------------------------------------------------------

def test_sections_in_order(full, cpu_only):
    assert [s.key for s in full.sections] == SECTION_KEYS
    # only local dram: no list of cases beside local dram (the first section says so once)
    assert [s.key for s in cpu_only.sections] == [k for k in SECTION_KEYS if k != "near-cases"]


def test_b7_uses_the_pool_shows_ratio_and_reasons(full):
    table = full.section("b7").table
    nt = _row(table, "B7a")
    stat, ratio, region = nt[3], nt[4], nt[5]
    assert isinstance(stat, Stat) and stat.median_ns == 4820  # the devdax row, not dram's 1000
    assert ratio == pytest.approx(4820 / 2410)
    assert region == "devdax:/dev/dax0.0"
    store_uc = _row(table, "B7b")
    assert isinstance(store_uc[3], NoValue) and UC_REASON in store_uc[3].reason
    assert store_uc[3].reason.startswith("skipped")
    assert store_uc[4] is None
    load_uc = _row(table, "B7d")
    assert load_uc[3].reason == "failed: worker crashed: SIGBUS"
    dsa = [r for r in table.rows if r[0] == "B7e"]
    assert [r[1] for r in dsa] == ["dsa-memmove, write", "dsa-memmove, read"]
    assert dsa[0][4] == pytest.approx(1.0)  # 1905 ns against the 1.69-2.12 us midpoint
    assert any("devdax:/dev/dax0.0" in n for n in full.section("b7").notes)


def test_b8_crossover_found_from_the_medians(full):
    section = full.section("b8")
    assert section.absent is None
    assert any("write" in n and "DSA is faster from 8KiB up" in n for n in section.notes)
    sizes = [r[0] for r in section.table.rows]
    assert sizes == sorted(sizes) and 8192 in sizes
    plot = section.plots[0]
    assert any(line.axis == "x" and line.value == 8192 for line in plot.lines)


def test_gpu_sections(full):
    b9 = full.section("b9")
    row = next(r for r in b9.table.rows if r[3] == 1024)
    headers = [c.name for c in b9.table.columns]
    ratio = row[headers.index("kernel / memcpy")]
    assert ratio == pytest.approx(30000 / 900000)
    assert any("1.23 ms at 16KiB (1.00× the paper" in n for n in b9.notes)  # B10: UC host memory below 24 KB
    b11 = full.section("b11").table
    memcpy = _row(b11, "cuda-memcpy")
    assert memcpy[2].median_ns == 11730 and memcpy[4].median_ns == 10320
    assert memcpy[3] == "devdax:/dev/dax0.0" and memcpy[5] == "pinned"
    assert memcpy[6] == pytest.approx(11730 / 10320)


def test_b15_mops_and_ratios(full):
    table = full.section("b15").table
    roundtrip = _row(table, "rpc-roundtrip")
    assert roundtrip[1] == "flush" and roundtrip[6] is None  # no Mops for a round trip
    assert roundtrip[7] == pytest.approx(1.0)
    throughput = _row(table, "rpc-throughput")
    assert throughput[1] == "coherent" and throughput[2] == "128"
    assert throughput[6] == pytest.approx(1000 / 250)
    assert throughput[7] == pytest.approx(4.0 / 12.13)


def test_s2_s3_kv_near_local_failures(full):
    s2 = full.section("s2").table
    ssd = _row(s2, "NVMe SSD")
    assert ssd[1].startswith("~7 GB/s") and "no such rows" in ssd[2].reason  # no file-read row
    nvlink = s2.rows[0]
    assert nvlink[2] == pytest.approx(450)
    assert nvlink[5] == pytest.approx(450 / 600)
    s3 = full.section("s3").table
    assert s3.rows[0][2] == "layers=4" and s3.rows[0][3].median_ns == 5000
    kv = full.section("b13").table
    assert {r[3] for r in kv.rows} >= {1024, 256}
    assert not any(r[0] == "chase" for r in kv.rows)  # a ring is no fragment transfer
    variants = {r[6]: r[7].median_ns for r in kv.rows if r[0] == "load" and r[3] == 1024}
    assert variants == {"-": 50000, "qd=16": 40000}  # parameters keep rows apart
    metadata = next(r for r in kv.rows if r[0] == "kv-metadata")
    assert metadata[-1] is None and metadata[8] is None  # nothing moved: no bandwidth
    gather = next(r for r in kv.rows if r[0] == "memcpy" and r[2].startswith("kv:qwen"))
    assert gather[7].median_ns == 90000 and gather[8] == pytest.approx(90000 + 800)
    near = full.section("near-cases").table
    numa = next(r for r in near.rows if r[4] == "numa:1" and r[0] == "load")
    assert numa[5] == "-" and numa[6].median_ns == 3000 and numa[7] == 1500
    assert numa[8] == pytest.approx(2.0)
    failures = full.section("failures")
    outcomes = {r[0]: r[1] for r in failures.table.rows}
    assert any(v == "failed: worker crashed: SIGBUS" for v in outcomes.values())
    assert outcomes["memcpy: 1 not converged"].startswith("64MiB; CI of the pooled median ±")
    b12 = full.section("b12").table
    pool_gpu = next(r for r in b12.rows if r[0] == "cuda-memcpy" and "devdax" in r[1])
    assert pool_gpu[4] is not None  # compared with the 26 GB/s cap
    assert not any(r[0].startswith("rpc-") for r in b12.rows)


# --- the files -----------------------------------------------------------------------------------

def test_a_full_disk_leaves_no_partial_report_or_plots(full, tmp_path, monkeypatch):
    """Issue 37: ENOSPC part way through a report leaves no half-written file and no plots
    without their report; the error is one line naming the option."""
    import errno
    import os

    from nearlocal import safeio
    from nearlocal.errors import UsageError

    real_fsync, calls = os.fsync, []

    def fsync_until_full(fd):
        calls.append(fd)
        if len(calls) > 1:  # the first plot fits, the disk is full after it
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(safeio.os, "fsync", fsync_until_full)
    with pytest.raises(UsageError, match=r"--markdown.*ENOSPC"):
        write_markdown(full, tmp_path / "report.md")
    calls.clear()
    calls.append("full")
    with pytest.raises(UsageError, match=r"--html.*ENOSPC"):
        write_html(full, tmp_path / "report.html")
    assert list(tmp_path.iterdir()) == []


def test_markdown_and_html_carry_values_ratios_and_reasons(full, tmp_path):
    files = write_markdown(full, tmp_path / "report.md")
    markdown = files[0].read_text()
    assert len(files) > 1 and all(f.suffix == ".png" and f.stat().st_size > 1000
                                  for f in files[1:])
    for f in files[1:]:
        assert f"]({f.name})" in markdown
    html = report_html(full)
    for text in (markdown, html):
        assert "B7a" in text and "2.41 us" in text
        assert "4.82 us (4.34–5.78)" in text  # median (p10–p90) of the pool row
        assert "2.00×" in text  # its ratio to the paper's 2.41 us
        assert UC_REASON in text
        assert "worker crashed: SIGBUS" in text
        assert "DSA is faster from 8KiB up" in text
        assert "no such rows in this run" in text  # the SSD row without file-read rows
        assert "reported by the paper" in text
        assert "wider than the run" in text  # the legend says what † ±x% means
    assert re.search(r"\| B7a \| nt-store, wb \| 2\.41 us \| 4\.82 us \(4\.34–5\.78\) \| "
                     r"2\.00× \| devdax:/dev/dax0\.0 \|", markdown)
    assert html.count("<svg") == sum(len(s.plots) for s in full.sections)
    assert "<script" not in html and 'src="http' not in html and 'href="http' not in html


def test_cpu_only_run_renders_every_section(cpu_only, tmp_path):
    absent = {s.key for s in cpu_only.sections if s.absent}
    assert {"b8", "b9", "b11", "b13", "b15", "rdma", "s2", "s3"} <= absent
    assert "near" not in absent  # its lead says once that only local DRAM was measured
    assert "dsa-memmove" in cpu_only.section("b8").absent
    assert "idxd driver is not loaded" in cpu_only.section("b8").absent
    assert any("no pool region measured" in n for n in cpu_only.section("b7").notes)
    assert _row(cpu_only.section("b7").table, "B7a")[5] == "dram"
    markdown = write_markdown(cpu_only, tmp_path / "cpu.md")[0].read_text()
    html = report_html(cpu_only)
    for section in cpu_only.sections:
        assert f"## {section.title}" in markdown
        assert f'<section id="{section.key}">' in html
        if section.absent:
            assert section.absent in markdown and section.absent in html
    assert markdown.count("\n> ") == len(absent)


def test_several_runs_become_side_by_side_columns(tmp_path):
    a = load(make_run(tmp_path, full_rows(1.0), run_id="run-a"))
    b = load(make_run(tmp_path, full_rows(2.0)[:5], run_id="run-b"))
    report = build_report([a, b])
    table = report.section("b7").table
    headers = [cell for cell in table.frame().columns]
    assert headers[3:] == ["median (p10–p90) [1]", "× paper [1]", "region [1]",
                           "median (p10–p90) [2]", "× paper [2]", "region [2]"]
    nt = _row(table, "B7a")
    assert nt[3].median_ns == 4820 and nt[6].median_ns == 9640
    assert nt[4] == pytest.approx(2.0) and nt[7] == pytest.approx(4.0)
    markdown = table_markdown(table)
    line = next(line for line in markdown.splitlines() if line.startswith("| B7a"))
    assert line.index("4.82 us") < line.index("9.64 us")
    # a key only one run has: the other run's cells say so
    b15 = report.section("b15").table
    assert isinstance(b15.rows[0][-3], NoValue) and b15.rows[0][-3].reason == "not in this run"
    html = table_html(table)
    assert 'colspan="3">run #1</th>' in html and 'colspan="3">run #2</th>' in html
    runs = report.section("runs").table
    assert [r[1] for r in runs.rows] == ["run-a", "run-b"]
    assert cell_text(table.columns[6], nt[6]).startswith("9.64 us")


def test_an_empty_run_still_renders_every_section(tmp_path):
    from nearlocal.store.writer import Store

    report = build_report([load(Store.create(tmp_path, {"suite": "quick"}).finish())])
    assert [s.key for s in report.sections] == [k for k in SECTION_KEYS if k != "near-cases"]
    assert report.section("b8").absent and not report.section("near").table
    assert _row(report.section("b7").table, "B7a")[3].reason == "no nt-store wb 16KiB row in " \
        "this run"
    assert "<section" in report_html(report)


# --- the command ---------------------------------------------------------------------------------

def test_cli_writes_html(tmp_path, capsys):
    make_run(tmp_path / "store", cpu_only_rows(), CPU_ONLY_INVENTORY, run_id="r1")
    html = tmp_path / "r.html"
    code = main(["report", "--out", str(tmp_path / "store"), "--html", str(html)])
    assert code == 0
    out = capsys.readouterr().out
    assert out.strip() == f"wrote {html}"  # writing a file says where, and nothing more
    assert html.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", "--out", str(tmp_path / "store")]) == 0  # no file: the tables
    out = capsys.readouterr().out
    assert "B7 — CPU access to the pool, 16 KB" in out and "No DSA measurement" in out
    assert main(["report", "r1", "r1", "--out", str(tmp_path / "store"), "--quiet"]) == 0


@pytest.mark.parametrize("args", [
    ["report", "nope"],
    ["report", "--html", "/no/such/dir/r.html"],
    ["report", "--markdown", "{tmp}"],
    ["report", "--quiet", "--html", "/proc/nearlocal-report.html"],  # the write itself fails
])
def test_cli_bad_input_exits_2(tmp_path, capsys, args):
    make_run(tmp_path / "store", cpu_only_rows(), CPU_ONLY_INVENTORY)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert main([*args, "--out", str(tmp_path / "store")]) == 2
    assert "error" in capsys.readouterr().err


def test_cli_empty_store_exits_2(tmp_path, capsys):
    assert main(["report", "--out", str(tmp_path / "none")]) == 2
    assert "no runs" in capsys.readouterr().err


def test_near_local_compares_with_dram_at_the_same_attribute(tmp_path):
    rows = [row("load", "dram", attr="uc", median=100000.0), row("load", "dram", median=1000.0),
            row("load", "numa:1", median=2000.0), row("load", "numa:1", attr="uc", median=300000.0)]
    near = build_report([load(make_run(tmp_path, rows))]).section("near-cases").table
    ratios = {r[4]: r[8] for r in near.rows}
    assert ratios == {"numa:1": pytest.approx(2.0), "numa:1[uc]": pytest.approx(3.0)}


# --- the top of the report, folded rows, plot captions ----------------------------------------

def test_the_report_opens_with_how_near_local_is(full, cpu_only):
    near = full.sections[0]
    assert near.key == "near" and near.title == "How near is local"
    pool, numa, gpu, outcome = near.lead
    assert pool == ("devdax:/dev/dax0.0, a CXL pool (device-dax): latency vs local DRAM 16KiB "
                    "not measured, 1GiB not measured; bandwidth 0.21× (nt-store 16KiB: 3.4 vs "
                    "16.4 GB/s).")
    assert numa == ("numa:1, a CPU-less NUMA node (CXL in system-ram mode): latency vs local "
                    "DRAM 16KiB 1.07× (1.6 ns vs 1.5 ns per load), 1GiB 2.00× (560.0 ns vs "
                    "280.0 ns per load); bandwidth 0.50× (load 64KiB: 21.8 vs 43.7 GB/s).")
    assert "64 KiB by cuda-memcpy from devdax:/dev/dax0.0 takes 1.14× the time from pinned" in gpu
    assert "1 failed" in outcome and "no provider on this box can map uncacheable memory (1)" \
        in outcome
    # what a † means, said where the count is: the interval's width against the run's target
    assert "1 not converged, marked †: their medians' 95% CIs are ±16% against the ±1% " \
        "target" in outcome
    unconverged = Stat(4e6, 3.6e6, 4.8e6, converged=False, rel_ci=0.155)
    assert cell_text(Column("median", "time"), unconverged) == "4.00 ms (3.60–4.80) † ±16%"
    rows = {(r[0], r[2]): r for r in near.table.rows}
    assert rows[("devdax:/dev/dax0.0", "write")][3:7] == [1, pytest.approx(4.82),
                                                          pytest.approx(4.82), pytest.approx(4.82)]
    assert rows[("numa:1", "read")][4] == pytest.approx(2.0)
    assert [r[0] for r in near.table.rows][:2] == ["devdax:/dev/dax0.0", "numa:1"]  # pool first
    only, _ = cpu_only.sections[0].lead  # a box with only local DRAM says so, once
    assert only.startswith("Only local DRAM was measured: this box has 1 NUMA node and no "
                           "device-dax pool")
    html = report_html(cpu_only)
    assert html.count("Only local DRAM was measured") == 1
    assert html.count('class="absent"') == len([s for s in cpu_only.sections if s.absent])
    html = report_html(full)
    assert html.index('<div class="verdict">') < html.index('<section id="runs">')
    assert html.index("bandwidth 0.21×") < html.index('<section id="b7">')


def test_idle_latency_does_not_compare_local_dram_with_itself(full, tmp_path):
    idle = full.section("idle").table
    local = [r for r in idle.rows if r[1] == "dram"]
    assert local and all(cell is None for r in local for cell in r[5:])
    numa = next(r for r in idle.rows if r[1] == "numa:1" and r[0] == 2**30)
    assert numa[6] == pytest.approx(2.0)
    rows = [row("chase", "dram", size=s, median=m) for s, m in ((16384, 1.5), (2**30, 280.0))]
    alone = build_report([load(make_run(tmp_path, rows, CPU_ONLY_INVENTORY))]).section("idle")
    assert [c.name for c in alone.table.columns] == ["ring", "region", "what", "pages",
                                                     "ns per load (p10–p90)"]


def test_b7_sets_no_paper_ratio_beside_memory_that_is_not_a_pool(cpu_only):
    nt = _row(cpu_only.section("b7").table, "B7a")
    assert isinstance(nt[4], NoValue) and nt[4].reason == "local DRAM, not a pool"


def test_shm_only_runs_say_no_pool_was_measured(tmp_path):
    rows = [row("load", "dram", size=4096 * k, median=100.0 * k) for k in (1, 2, 4)]
    rows += [row("load", "shm:x", size=4096 * k, median=110.0 * k) for k in (1, 2, 4)]
    lead = build_report([load(make_run(tmp_path, rows))]).sections[0].lead[0]
    assert lead.startswith("Only local DRAM was measured: the run measured no other region")


def test_acceptance_verdicts_of_the_host_follow_the_region_lines(tmp_path):
    """An accept run stored before verdicts were kept (tests/test_accept.py: those that keep
    them) is said as not judged when stored: its spec file, still there, is never read again."""
    spec = tmp_path / "spec.toml"
    spec.write_text('title = "t"\n'
                    '[[requirement]]\nname = "load 16 KiB within 1 us"\n'
                    'case = { method = "load", region = "dram", size = "16KiB" }\nmax = "1us"\n')
    store = tmp_path / "store"
    accepted = load(make_run(store, [row("load", "dram", median=500.0)],
                             CPU_ONLY_INVENTORY | {"host_id": "abc123"},
                             run_id="20260101T000000-acc",
                             meta={"suite": "accept:spec.toml", "spec": str(spec)}))
    run = load(make_run(store, cpu_only_rows(), CPU_ONLY_INVENTORY | {"host_id": "abc123"},
                        run_id="20260102T000000-run"))
    lead = build_report([run]).sections[0].lead
    assert lead[0].startswith("Only local DRAM was measured")
    assert lead[1] == ("Acceptance spec.toml (run 20260101T000000-acc): not judged when stored: "
                       "the run kept no verdicts (accepted before accept stored them; "
                       "`nearlocal accept SPEC RUN` judges it and keeps them).")
    assert not any(line.startswith(("PASS", "FAIL")) for line in lead)
    assert build_report([accepted]).sections[0].lead[1] == lead[1]  # its own report: the same
    other_host = load(make_run(tmp_path / "other", cpu_only_rows(),
                               CPU_ONLY_INVENTORY | {"host_id": "zzz"}))
    assert not any("spec.toml" in line for line in build_report([other_host]).sections[0].lead)


def test_a_later_accept_run_that_kept_no_verdicts_is_said_before_the_older_kept_one(tmp_path):
    """Stored runs of both ages on one host: the later kept none, so it is not judged when
    stored, and the older run's kept verdict is shown in its place, said to be the older's."""
    spec = tmp_path / "spec.toml"
    store = tmp_path / "store"
    host = CPU_ONLY_INVENTORY | {"host_id": "abc123"}
    accept_meta = {"suite": "accept:spec.toml", "spec": str(spec)}
    old = make_run(store, [row("load", "dram", median=500.0)], host,
                   run_id="20260101T000000-old", meta=accept_meta)
    store_acceptance(load(old), AcceptanceRecord(
        str(spec), "", "spec", "", "", "2026-01-01T00:00:00Z", (VerdictRecord(
            "load 16 KiB within 1 us", "load/dram/wb/16KiB", "median_ns", "max", 1000.0, True,
            500.0),)))
    make_run(store, [row("load", "dram", median=500.0)], host, run_id="20260102T000000-new",
             meta=accept_meta)
    run = load(make_run(store, cpu_only_rows(), host, run_id="20260103T000000-run"))
    newer, older = build_report([run]).sections[0].lead[1:3]
    assert newer.startswith("Acceptance spec.toml (run 20260102T000000-new): not judged when "
                            "stored: the run kept no verdicts")
    assert newer.endswith("the verdict shown is the older run 20260101T000000-old's.")
    assert older == "PASS: spec.toml, all 1 requirements (run 20260101T000000-old)."


def test_a_later_accept_run_that_cannot_be_judged_is_said_before_the_older_verdict(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text('[[requirement]]\nname = "load 16 KiB within 1 us"\n'
                    'case = { method = "load", region = "dram", size = "16KiB" }\nmax = "1us"\n')
    store = tmp_path / "store"
    accept_meta = {"suite": "accept:spec.toml", "spec": str(spec)}
    host = CPU_ONLY_INVENTORY | {"host_id": "abc123"}
    for run_id in ("20260101T000000-old", "20260102T000000-new"):
        made = make_run(store, [row("load", "dram", median=500.0)], host, run_id=run_id,
                        meta=accept_meta)
        store_acceptance(load(made), AcceptanceRecord(
            str(spec), "", "spec", "", "", "2026-01-01T00:00:00Z", (VerdictRecord(
                "load 16 KiB within 1 us", "load/dram/wb/16KiB", "median_ns", "max", 1000.0,
                True, 500.0),)))
    (store / "20260102T000000-new" / "cases.parquet").write_bytes(b"not parquet")
    make_run(store, [row("load", "dram", median=500.0)], host, run_id="20260103T000000-odd")
    (store / "20260103T000000-odd" / "run.json").write_text("{")  # its kind cannot be told
    run = load(make_run(store, cpu_only_rows(), host, run_id="20260104T000000-run"))
    lead = build_report([run]).sections[0].lead
    skipped, older, odd = lead[1:4]
    assert skipped.startswith("Acceptance spec.toml (run 20260102T000000-new): not judged: the "
                              "run is damaged: cases.parquet is not a readable Parquet file (")
    assert "magic bytes" in skipped  # pyarrow's own words for it, on the same line
    assert skipped.endswith("the verdict shown is the older run 20260101T000000-old's.")
    assert older.startswith("PASS: spec.toml, all 1 requirements (run 20260101T000000-old).")
    assert odd.startswith("Acceptance (run 20260103T000000-odd): not judged: the run is damaged: "
                          "run.json is not JSON (")
    assert all("\n" not in line for line in lead)


def test_a_median_below_the_clock_step_is_no_figure():
    from nearlocal.report.fmt import _time

    assert _time(Stat(3.0, 0.4, 12.0, True, 10.0)) == "<10 ns (<10–12.0)"
    assert _time(Stat(30.0, 20.0, 40.0)) == "30.0 ns (20.0–40.0)"


def test_rows_without_a_number_fold_into_one_line_per_reason(tmp_path):
    no_gpu = "no GPU: cupy is not importable"
    rows = [row("load", "shm:kv", size=160 * n, fragments=n, median=10.0 * n) for n in (8, 16)]
    rows += [row(m, "pinned", size=160 * n, fragments=n, peer="gpu:0", marker="gpu",
                 status="skipped", reason=no_gpu)
             for m in ("gather-kernel", "cuda-memcpy") for n in (8, 16, 32)]
    rows.append(row("dsa-memmove", "dram", size=160 * 8, fragments=8, marker="dsa",
                    status="skipped", reason="no DSA"))
    rows += [row("store", "dram", attr="uc", access="write", status="skipped", reason=UC_REASON),
             row("load", "dram", attr="uc", status="skipped", reason=UC_REASON)]
    report = build_report([load(make_run(tmp_path, rows))])
    kv = report.section("b13").table
    assert [r[0] for r in kv.rows] == ["dsa-memmove", "load", "load"]  # a lone reason stays
    (folded,) = kv.collapsed
    assert folded.count == 6 and folded.reason == f"skipped: {no_gpu}"
    assert folded.examples == ("cuda-memcpy", "gather-kernel")
    b7 = report.section("b7").table  # one row per paper figure, never folded
    assert not b7.collapsed and len(b7.rows) == 7  # B7a has nt-store and nt-copy
    line = f"6 rows without a number (method: cuda-memcpy, gather-kernel): skipped: {no_gpu}"
    markdown = write_markdown(report, tmp_path / "r.md")[0].read_text()
    html = report_html(report)
    assert markdown.count(line) == 1 and html.count(line) == 1
    b13 = html[html.index('<section id="b13">'):]
    assert b13[:b13.index("</section>")].count(no_gpu) == 1  # not once per row


def test_plot_captions_name_only_what_is_drawn_in_distinct_colours_and_markers(full):
    from nearlocal.report.plots import caption, draw

    latency = full.section("b7").plots[0]
    assert latency.points and not latency.lines
    text = caption(latency)
    assert "black stars" in text and "dashed" not in text
    crossover = full.section("b8").plots[0]
    text = caption(crossover)
    assert "grey dashed lines" in text and "crossovers found from this box's medians" in text
    axes = draw(latency).axes[0]
    styles = [(line.get_color(), line.get_marker()) for line in axes.get_lines()
              if not line.get_label().startswith("_")]
    assert len(styles) == len(latency.series) and len(set(styles)) == len(styles)


def test_terminal_report_off_a_tty_keeps_rows_on_one_line(full):
    import io

    from rich.console import Console

    from nearlocal.report.render_terminal import print_report

    buffer = io.StringIO()
    print_report(full, Console(file=buffer, width=80))
    lines = buffer.getvalue().splitlines()
    kv = [line for line in lines if line.startswith("| memcpy ") and "kv:qwen" in line]
    assert len(kv) == 1 and "90.00 us" in kv[0]  # one row, one line, wider than 80 columns
    assert not any("…" in line for line in lines)
