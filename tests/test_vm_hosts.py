"""scripts/vm_hosts.py, the two-host stage's facts, on synthetic guest output (no QEMU): the
launch, bad input across hosts (one line from rank 0, exit 2, nothing stored), and host loss
(the survivor's row ok, the killed host's row saying so, the lost host named)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.report_fixtures import make_run, row

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import vm_hosts  # noqa: E402 - a script, found through sys.path

POOL_LINE = ("nearlocal: error: pool file:/tmp/p.bin does not exist on host nlhost-b (rank 1): "
             "every rank needs the same pool (a shared device or file)")
RDMA_LINE = ("nearlocal: error: on host nlhost-b (rank 1): no RDMA device: /sys/class/infiniband "
             "is empty: every rank of rdma-write needs an RDMA device")


def _job(out: Path, name: str, rc: int, wall: int, err: str = "", text: str = "") -> None:
    (out / f"{name}.rc").write_text(f"{rc} {wall}\n")
    (out / f"{name}.err").write_text(err)
    (out / f"{name}.out").write_text(text)


def _launch_and_bad_input(out: Path, pool_err: str = POOL_LINE) -> None:
    _job(out, "hostnames", 0, 5, text="nlhost-a\nnlhost-b\n")
    _job(out, "bad-host", 255, 4, "ssh: connect to host nlhost-c port 22: No route to host\n")
    _job(out, "bad-pool", 2, 35, pool_err + "\n----\nprterun detected ...\n")
    _job(out, "bad-rdma", 2, 38, RDMA_LINE + "\n")


def test_launch_and_bad_input_hold_on_a_good_guest(tmp_path):
    _launch_and_bad_input(tmp_path)
    facts = vm_hosts.Facts()
    vm_hosts.check_launch(tmp_path, facts)
    vm_hosts.check_bad_input(tmp_path, facts)
    assert not facts.failed and len(facts.held) == 5


def test_a_second_error_line_or_a_stored_run_fails_the_bad_input_facts(tmp_path):
    _launch_and_bad_input(tmp_path, pool_err=POOL_LINE + "\n" + POOL_LINE)
    (tmp_path / "bad-results" / "20261205T000000-x").mkdir(parents=True)
    facts = vm_hosts.Facts()
    vm_hosts.check_bad_input(tmp_path, facts)
    assert any(f.startswith("bad-pool: exit 2") for f in facts.failed)
    assert any("stored nothing (1 run folder" in f for f in facts.failed)


def _loss_guest(out_a: Path, out_b: Path, survivor_ok: bool = True) -> None:
    out_a.mkdir()
    out_b.mkdir()
    (out_b / "killed.json").write_text(json.dumps({"pid": 4242, "at_s": 568}))
    _job(out_a, "loss", 137, 150)
    lost = ("lost: rank 1 on host nlhost-b did not answer within the deadline while measuring "
            "rack-host-loss/x: its host stopped answering during the host-loss case")
    reader = row("rack-host-loss", "devdax:/dev/dax0.0", median=1.0)
    reader.update(host="nlhost-a", detections=249.0 if survivor_ok else 0.0, torn_reads=0.0,
                  case_id=reader["case_id"] + "/rank=0")
    writer = row("rack-host-loss", "devdax:/dev/dax0.0", status="failed", reason=lost)
    writer.update(host="nlhost-b", case_id=writer["case_id"] + "/rank=1")
    make_run(out_a / "loss-results", [reader, writer],
             meta={"incomplete_reason": "ranks lost: rank 1 on host nlhost-b did not answer"})


def test_host_loss_facts_hold_and_a_missed_detection_fails_them(tmp_path):
    _loss_guest(tmp_path / "a", tmp_path / "b")
    facts = vm_hosts.Facts()
    vm_hosts.check_loss(tmp_path / "a", tmp_path / "b", facts)
    assert not facts.failed, facts.failed
    _loss_guest(tmp_path / "a2", tmp_path / "b2", survivor_ok=False)
    missed = vm_hosts.Facts()
    vm_hosts.check_loss(tmp_path / "a2", tmp_path / "b2", missed)
    assert [f for f in missed.failed if f.startswith("nlhost-a's readers")]


def test_without_its_two_folders_it_says_how_to_call_it():
    proc = subprocess.run([sys.executable, str(SCRIPTS / "vm_hosts.py")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "OUT_A OUT_B" in proc.stderr


def test_the_ping_pong_fact_is_rounded_for_a_person(tmp_path):
    """Issue 56: the rig printed run.json's MPI ping-pong as `1499.9999999929514 us`."""
    _job(tmp_path, "run", 0, 60)
    (tmp_path / "show.txt").write_text("")
    make_run(tmp_path / "results", [{**row("load"), "host": "nlhost-a"}], meta={
        "mpi": {"ranks": 2, "coherent_host": False, "pingpong_us": 1499.9999999929514}})
    facts = vm_hosts.Facts()
    vm_hosts.check_run(tmp_path, facts)
    text = "\n".join(facts.held + facts.failed)
    assert "MPI ping-pong 1500 us" in text and "1499.99" not in text


def test_the_rdma_facts_take_one_transfer_rows_beside_movers_rows():
    """The rdma suite's movers=2 rows (k queue pairs at once) share a 16 KiB pattern and sge with
    the one-transfer rows: the facts about one transfer's work requests take the latter only
    (CI at 38d4a32 read '2 rows' there)."""
    import pandas as pd

    records = []
    for method in ("rdma-write", "rdma-read"):
        for pattern, pieces in vm_hosts.PATTERNS.items():
            for variant in ("one", "batched"):
                wrs = pieces if variant == "one" else -(-pieces // 32)
                records.append({"method": method, "pattern": pattern, "status": "ok",
                                "reason": "", "params": json.dumps({"sge": variant}),
                                "info": json.dumps({"sge": variant, "max_sge": 32,
                                                    "max_sge_rd": 32,
                                                    "work_requests_per_sample": wrs,
                                                    "data_check": "ok: equal"})})
        records.append({"method": method, "pattern": "16KiB", "status": "ok", "reason": "",
                        "params": json.dumps({"movers": "2"}),
                        "info": json.dumps({"sge": "batched", "work_requests_per_sample": 1,
                                            "data_check": "ok: equal", "movers": 2})})
        records.append({"method": method, "pattern": "16KiB", "status": "ok", "reason": "",
                        "params": json.dumps({"mtu": "4096"}),
                        "info": json.dumps({"sge": "batched", "path_mtu": 4096})})
    for transport in ("write", "send"):
        records.append({"method": "rdma-rpc", "pattern": "64B", "status": "ok", "reason": "",
                        "params": json.dumps({"transport": transport}),
                        "info": json.dumps({"data_check": "ok: served"})})
    facts = vm_hosts.Facts()
    vm_hosts.check_rdma(pd.DataFrame(records), facts)
    assert facts.failed == [], facts.failed


def test_the_contention_fit_finds_the_pools_rack_way_at_k_2_in_the_guests_rows(tmp_path):
    """The two ranks' rack-aggregate rows (one per host, their alone passes in the info): the
    fit's rack way at k = 1 and 2; without them the fact fails."""
    _job(tmp_path, "run", 0, 60)
    (tmp_path / "show.txt").write_text("")
    rows = []
    for rank, host in enumerate(vm_hosts.HOSTS):
        base = row("rack-aggregate", "devdax:/dev/dax0.0", size=2**20, median=5000.0)
        info = {"movers": 2, "movers_group": base["case_id"], "bytes_per_mover": 2**20,
                "movers_are": "MPI ranks, one per host", "aggregate_gbps": 0.4,
                "alone_samples_ns": [3000.0, 3100.0]}
        rows.append({**base, "case_id": f"{base['case_id']}/rank={rank}", "host": host,
                     "info": info})
    make_run(tmp_path / "results", rows, meta={"mpi": {"ranks": 2, "coherent_host": False}})
    facts = vm_hosts.Facts()
    vm_hosts.check_run(tmp_path, facts)
    assert [f for f in facts.held if f.startswith("contention: ")], facts.failed
    bare = tmp_path / "bare"
    bare.mkdir()
    _job(bare, "run", 0, 60)
    (bare / "show.txt").write_text("")
    make_run(bare / "results", [{**row("load"), "host": "nlhost-a"}])
    missing = vm_hosts.Facts()
    vm_hosts.check_run(bare, missing)
    assert [f for f in missing.failed if f.startswith("contention: ")]
