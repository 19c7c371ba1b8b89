"""Issue 39's report: a run holding both pool and RDMA rows shows B1, B13, B14 and B15 with both
columns measured and the paper's ratio beside the measured one; the rack section has the RDMA
RPC beside the shared-pool RPC (synthetic rows through the real store)."""

from __future__ import annotations

import pytest

from nearlocal.report.papers import figure
from nearlocal.report.tables import NoValue, Stat, build_report
from nearlocal.store import load
from tests.report_fixtures import make_run, row

POOL = "devdax:/dev/dax0.0"
DENSE = "kv:qwen2.5-32b:flash-attn:dense"


def _rdma(method: str, pattern: str, size: int, fragments: int, median: float, sge: str,
          requests: int, access: str = "write", **info) -> dict:
    data = row(method, "dram", access=access, size=size, fragments=fragments, pattern=pattern,
               median=median, params={"sge": sge} if method != "rdma-rpc" else {})
    data["info"] = {"work_requests_per_sample": requests, "device": "rxe0",
                    "data_check": "ok: 16384 bytes on rank 1 equal rank 0's", **info}
    data["max_sge"] = 32
    return data


def _rows() -> list[dict]:
    return [
        row("nt-copy", POOL, access="write", median=2_000.0),
        row("nt-copy", "dram", access="write", median=500.0),  # local: not the pool's side
        row("memcpy", POOL, access="write", size=128 * 20480, fragments=128, pattern=DENSE,
            median=60_000.0),
        row("memcpy", POOL, access="read", size=128 * 20480, fragments=128, pattern=DENSE,
            median=50_000.0),
        row("memcpy", POOL, access="read", size=1024 * 160, fragments=1024, median=20_000.0),
        row("rpc-roundtrip", "shm:nl", access="write", size=64, pattern="rpc:128x64B",
            median=2_000.0),
        _rdma("rdma-write", "16KiB", 16384, 1, 10_000.0, "batched", 1,
              data_movement_ns=2_500.0, sync_share=0.75),
        _rdma("rdma-write", "16KiB", 16384, 1, 11_000.0, "one", 1),
        _rdma("rdma-write", DENSE, 128 * 20480, 128, 100_000.0, "batched", 4),
        _rdma("rdma-read", DENSE, 128 * 20480, 128, 80_000.0, "batched", 4, access="read"),
        _rdma("rdma-read", "1024x160B", 1024 * 160, 1024, 400_000.0, "batched", 32,
              access="read"),
        _rdma("rdma-read", "1024x160B", 1024 * 160, 1024, 900_000.0, "one", 1024,
              access="read"),
        _rdma("rdma-rpc", "64B", 64, 1, 8_000.0, "", 1),
    ]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return build_report([load(make_run(tmp_path_factory.mktemp("rdma"), _rows()))])


def _line(table, fig: str, what: str) -> list:
    return next(r for r in table.rows if r[0] == fig and r[1] == what)


def test_both_columns_measured_beside_the_papers_ratio(report):
    table = report.section("rdma").table
    b1 = _line(table, "B1", "16 KiB write")
    assert b1[3].median_ns == 2000.0 and b1[4].median_ns == 10_000.0  # pool row, batched RDMA
    assert b1[5] == pytest.approx(0.2)
    assert b1[6] == pytest.approx(figure("B7a").value().ns() / figure("B1").value("total").ns())
    assert "synchronisation 75%" in b1[7] and "1 WRs per transfer, max_sge 32," in b1[7]
    assert _line(table, "B13", "dense KV block read")[5] == pytest.approx(50_000 / 80_000)
    assert _line(table, "B13", "dense KV block read")[6] == pytest.approx(1 - 0.387)
    b14 = _line(table, "B14", "sparse read, 1,024 x 160 B")
    assert b14[5] == pytest.approx(20_000 / 400_000) and b14[6] == pytest.approx(211 / 5260)
    b15 = _line(table, "B15", "64 B metadata RPC round trip")
    assert b15[5] == pytest.approx(0.25) and b15[6] == pytest.approx(2.11 / 8.39)


def test_a_side_without_rows_says_so(tmp_path):
    only_pool = build_report([load(make_run(tmp_path, _rows()[:6]))])
    assert "No RDMA rows" in only_pool.section("rdma").absent
    only_rdma = build_report([load(make_run(tmp_path / "r", _rows()[6:]))])
    b1 = _line(only_rdma.section("rdma").table, "B1", "16 KiB write")
    assert isinstance(b1[3], NoValue) and isinstance(b1[4], Stat) and b1[5] is None


def test_rack_section_has_the_rdma_rpc_beside_the_pools(tmp_path):
    rows = _rows()
    for data in rows:
        data["host"] = "box"
    report = build_report([load(make_run(tmp_path, rows))])
    table = report.section("rack").table
    rpc = next(r for r in table.rows if str(r[0]).startswith("rdma-rpc"))
    assert rpc[3].median_ns == 8000.0
    assert rpc[8] == pytest.approx(8000 / figure("B15").value("RDMA RC RPC round trip").ns())


def test_lines_measured_on_an_emulated_box_say_so(tmp_path):
    """A run of two TCG guests (the rig's two-host stage): every line's note says the figures
    are an emulated box's, from the inventory of the host that measured the row."""
    from tests.report_fixtures import INVENTORY

    tcg = {**INVENTORY, "cpu": {**INVENTORY.get("cpu", {}), "model": "QEMU TCG CPU version 2.5+"}}
    rows = _rows()
    for data in rows:
        data["host"] = "nlhost-a"
    meta = {"mpi": {"ranks": 2, "hosts": [{"rank": 0, "hostname": "nlhost-a"},
                                         {"rank": 1, "hostname": "nlhost-b"}]},
            "host_inventories": {"0": tcg, "1": tcg}}
    table = build_report([load(make_run(tmp_path, rows, meta=meta))]).section("rdma").table
    notes = [r[7] for r in table.rows]
    assert notes and all("emulated box (QEMU TCG CPU version 2.5+)" in n for n in notes)
    plain = build_report([load(make_run(tmp_path / "real", _rows()))]).section("rdma").table
    assert not any("emulated" in r[7] for r in plain.rows)


def test_emulation_note_names_tcg_a_vm_or_nothing():
    from nearlocal.probe.cpu import emulation_note

    assert "no memory timing" in emulation_note({"model": "QEMU TCG CPU version 2.5+"})
    assert "virtual machine" in emulation_note({"model": "AMD EPYC", "flags": {"hypervisor": True}})
    assert emulation_note({"model": "AMD EPYC", "flags": {"hypervisor": False}}) == ""


def test_b15_stands_on_the_send_recv_rpc_and_the_rack_section_keeps_both(tmp_path):
    """B15's RDMA RC RPC is send/recv: the report's B15 line takes the transport=send row where
    the run has one (even when the RDMA-write RPC is faster); the rack section lists both."""
    send = row("rdma-rpc", "dram", access="write", size=64, pattern="64B", median=12_000.0,
               params={"transport": "send"})
    send["info"] = {"transport": "send", "path_mtu": 1024, "device": "rxe0",
                    "work_requests_per_sample": 1, "data_check": "ok: the last reply equals its request"}
    rows = [*_rows(), send]
    for data in rows:
        data["host"] = "box"
    report = build_report([load(make_run(tmp_path, rows))])
    b15 = _line(report.section("rdma").table, "B15", "64 B metadata RPC round trip")
    assert b15[4].median_ns == 12_000.0 and "transport send, path MTU 1024" in b15[7]
    labels = [str(r[0]) for r in report.section("rack").table.rows
              if str(r[0]).startswith("rdma-rpc")]
    assert sorted(labels) == ["rdma-rpc 64B send", "rdma-rpc 64B write"]


def test_b1_stands_on_a_transfer_alone_never_a_movers_row(tmp_path):
    """A movers=2 row (2 queue pairs at once, contention's) is never the RDMA side of a line,
    even when its per-mover median is the faster one."""
    movers = row("rdma-write", "dram", access="write", size=16384, pattern="16KiB",
                 median=5_000.0, params={"movers": "2"})
    movers["info"] = {"movers": 2, "work_requests_per_sample": 1, "device": "rxe0"}
    report = build_report([load(make_run(tmp_path, [*_rows(), movers]))])
    b1 = _line(report.section("rdma").table, "B1", "16 KiB write")
    assert b1[4].median_ns == 10_000.0


def test_the_rack_section_reads_the_stored_mpi_rank_beside_the_pool_rank(tmp_path):
    """Issue 59: an MPI job's rows keep their MPI `rank` (the report's pool-class rank is
    `pool_rank`), so the rack section names each row's rank from it, not from its case id."""
    from nearlocal.report.rows import SHARED_CLASS, prepare

    rows = []
    for rank in (1, 2):
        data = row("rack-rpc-roundtrip", "shm:pool", access="write", size=64, pattern="64B",
                   median=2_000.0 * rank)
        data.update(host=f"h{rank}", rank=rank, case_id=f"{data['case_id']}/r{rank}")
        rows.append(data)
    run = load(make_run(tmp_path, rows))
    frame = prepare(run)
    assert list(frame["rank"]) == [1, 2] and set(frame["pool_rank"]) == {SHARED_CLASS}
    table = build_report([run]).section("rack").table
    assert sorted((str(r[1]), str(r[2])) for r in table.rows) == [("1", "h1"), ("2", "h2")]
