"""scripts/vm_rdma.py, the RDMA stage's facts, on what a good guest writes and on a guest whose
data check failed or whose requests do not follow max_sge (no QEMU: synthetic guest output)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from tests.report_fixtures import make_run, row

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import vm_rdma

PIECES = {"16KiB": (1, 16384), "128x20KiB": (128, 20480), "1024x160B": (1024, 160)}
LIMITS = {"max_sge": 32, "max_sge_rd": 32, "max_qp_wr": 1048576, "max_mr_size": 2**64 - 1}


def _movers_info(k: int = 2, movers_said: int = 2) -> dict:
    return {"sge": "batched", "work_requests_per_sample": 1, "movers": movers_said,
            "bytes_per_mover": 16384, "aggregate_gbps": 0.05,
            "per_mover": [{"qp": m, "qp_num": 17 + m, "median_ns": 600_000.0, "gbps": 0.027}
                          for m in range(k)],
            "mover_samples_ns": [[600_000.0, 610_000.0] for _ in range(k)],
            "data_check": f"ok: {2 * 16384} bytes on rank 1 equal rank 0's",
            "concurrency": "2 queue pairs (RC) on one ... shared CQ"}


def _guest(out: Path, bad_check: str = "", wrong_requests: str = "", active_mtu: int = 1024,
           send_rpc: bool = True, movers: dict | None = None) -> Path:
    rows = []
    for method in ("rdma-write", "rdma-read"):
        for pattern, (count, size) in PIECES.items():
            for variant in ("one", "batched"):
                data = row(method, access="write" if method == "rdma-write" else "read",
                           size=count * size, fragments=count, pattern=pattern,
                           params={"sge": "one"} if variant == "one" else {})
                requests = count if variant == "one" else math.ceil(count / 32)
                if f"{method} {pattern} {variant}" == wrong_requests:
                    requests += 1
                check = "FAILED: 3 of 16384 bytes differ" if f"{method} {pattern} {variant}" \
                    == bad_check else "ok: equal"
                data["info"] = {"sge": variant, "work_requests_per_sample": requests,
                                "data_check": check, "data_movement_ns": 100.0}
                data["max_sge"] = 32
                rows.append(data)
    for transport in ("write", "send") if send_rpc else ("write",):
        rpc = row("rdma-rpc", size=64, pattern="64B",
                  params={"transport": "send"} if transport == "send" else {})
        rpc["info"] = {"data_check": "ok: the last reply equals its request", "requests_served": 9,
                       "transport": transport}
        rows.append(rpc)
    for method in ("rdma-write", "rdma-read"):  # the suite's 16 KiB rows at path MTU 4096
        access = "write" if method == "rdma-write" else "read"
        if active_mtu >= 4096:
            data = row(method, access=access, params={"mtu": "4096"})
            data["info"] = {"sge": "batched", "work_requests_per_sample": 1, "path_mtu": 4096,
                            "data_check": "ok: equal", "data_movement_ns": 100.0}
        else:
            data = row(method, access=access, params={"mtu": "4096"}, status="skipped",
                       reason=f"mtu=4096 is above rxe0 port 1's active MTU {active_mtu}: the "
                              f"path MTU cannot exceed it (mtu={active_mtu} or less runs here)")
        rows.append(data)
    for method in ("rdma-write", "rdma-read"):  # the suite's 16 KiB rows by 2 queue pairs
        data = row(method, access="write" if method == "rdma-write" else "read",
                   params={"movers": "2"}, median=600_000.0)
        data["info"] = (movers or {}).get(method) or _movers_info()
        data["max_sge"] = 32
        rows.append(data)
    make_run(out / "results", rows)
    port = {"port": 1, "state": "ACTIVE", "link_layer": "Ethernet", "lid": 0,
            "gids": [[1, "0000:0000:0000:0000:0000:ffff:0a4d:0001", "RoCE v2"]], "netdev": "x",
            "active_mtu": active_mtu, "max_mtu": 4096}
    (out / "probe.json").write_text(json.dumps({"inventory": {"rdma": {"devices": [
        {"name": "rxe0", "ports": [port], "limits": LIMITS}], "verbs": True, "reason": ""}}}))
    (out / "run.rc").write_text("0\n")
    (out / "perftest.rc").write_text("0\n")
    (out / "perftest.txt").write_text(
        "rdma-write median vs ib_write_lat t_typical 10.00 5.00 2.00\n"
        "rdma-read median vs ib_read_lat t_typical 10.00 10.00 1.00\n")
    _replay(out)
    return out


def _replay(out: Path, **damage) -> None:
    """What the guest's RDMA replay and replay_check.py --replay write."""
    records = [{"arrival_ns": 0.0, "wait_ns": 0.0, "transfer_ns": 0.0, "bytes": 0, "mover": -1},
               {"arrival_ns": 1e6, "wait_ns": 2e5, "transfer_ns": 3e6, "bytes": 4096, "mover": 0},
               {"arrival_ns": 1e6, "wait_ns": 1e5, "transfer_ns": 3e6, "bytes": 4096, "mover": 1}]
    if damage.get("unmoved"):
        records[2]["mover"] = -1
    replay = {"method": "rdma-read", "movers": 2, "path": "rdma (rdma-read, dram pool ...)",
              "requests": 3, "bytes": 8192, "fragments": 4, "per_request": records,
              "wait": {"p50_ns": 1e5}, "transfer": {"p50_ns": 3e6},
              "data_check": damage.get("check", "ok: 512 bytes in 4 fragments ... equal rank 1's"),
              "emulated": "measured on an emulated box (QEMU TCG ...)"}
    (out / "replay.json").write_text(json.dumps(replay))
    (out / "replay.rc").write_text("0\n")
    if damage.get("no_check"):
        (out / "replay-check.json").unlink(missing_ok=True)
        return
    (out / "replay-check.json").write_text(json.dumps({
        "way": "rdma/rdma-read", "transfer_rows": ["rdma-read/dram/wb/16KiB"],
        "emulated": "emulated", "loads": [{
            "simulated_reload": {"p50_ns": 2e6, "p99_ns": 4e6},
            "replay_reload": {"p50_ns": 3e6, "p99_ns": 3.2e6}, "pass": False}]}))


@pytest.mark.parametrize("active_mtu", [1024, 4096])
def test_the_facts_hold_on_what_a_good_guest_writes(tmp_path, active_mtu):
    """Soft-RoCE on a 1500 B netdev (active MTU 1024: the mtu=4096 rows skipped, saying so) or
    on jumbo frames (4096: they run at that path MTU)."""
    facts, problems = vm_rdma.check(_guest(tmp_path, active_mtu=active_mtu))
    assert not problems and len(facts) == 3 + 1 + 12 + 2 + 2 + 2 + 1 + 1 + 1 + 5
    replay = [f for f in facts if f.startswith("RDMA replay:")]
    assert len(replay) == 5 and any("never compared" in f for f in replay)
    movers = [f for f in facts if "16KiB movers=2:" in f]
    assert len(movers) == 2 and all("per mover [qp 0:" in f for f in movers)
    (fit,) = [f for f in facts if f.startswith("contention:")]
    assert "rdma/rdma-read: k=1" in fit and "rdma/rdma-write: k=1" in fit and "k=2" in fit
    assert any(f"mtu=4096 (active MTU {active_mtu})" in fact for fact in facts)


def test_a_missing_send_rpc_row_is_a_failed_fact(tmp_path):
    _, problems = vm_rdma.check(_guest(tmp_path, send_rpc=False))
    assert len(problems) == 1 and "transport=send: 0 rows" in problems[0]


@pytest.mark.parametrize("damage", [{"bad_check": "rdma-read 1024x160B batched"},
                                    {"wrong_requests": "rdma-write 128x20KiB batched"}])
def test_a_failed_check_or_a_wrong_split_is_a_failed_fact(tmp_path, damage):
    _, problems = vm_rdma.check(_guest(tmp_path, **damage))
    assert len(problems) == 1


@pytest.mark.parametrize("info", [_movers_info(k=1), _movers_info(movers_said=1),
                                  {**_movers_info(), "data_check": "FAILED: 9 of 32768 bytes differ"},
                                  {**_movers_info(), "mover_samples_ns": [[1.0], []]}])
def test_a_movers_row_without_k_each_movers_figures_or_its_check_is_a_failed_fact(tmp_path, info):
    _, problems = vm_rdma.check(_guest(tmp_path, movers={"rdma-read": info}))
    assert problems and all("movers=2" in p or p.startswith("contention:") for p in problems)
    assert any(p.startswith("rdma-read 16KiB movers=2") for p in problems)


@pytest.mark.parametrize("damage, words", [
    ({"unmoved": True}, "every request moved (1 of 2"),
    ({"check": "FAILED: 9 of 512 bytes differ from rank 1's"}, "data check FAILED"),
    ({"no_check": True}, "gave no prediction"),
])
def test_an_rdma_replay_that_left_a_request_failed_its_check_or_was_not_predicted_fails(
        tmp_path, damage, words):
    out = _guest(tmp_path)
    _replay(out, **damage)
    _, problems = vm_rdma.check(out)
    assert len(problems) == 1 and words in problems[0]


def test_a_slow_prediction_is_never_a_failed_fact(tmp_path):
    """The simulation's figures are shown beside the replay's, never judged (TCG): a load that
    replay_check.py fails is no problem of the rig's."""
    _, problems = vm_rdma.check(_guest(tmp_path))
    assert not problems
