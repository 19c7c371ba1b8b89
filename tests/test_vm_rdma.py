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


def _guest(out: Path, bad_check: str = "", wrong_requests: str = "") -> Path:
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
    rpc = row("rdma-rpc", size=64, pattern="64B")
    rpc["info"] = {"data_check": "ok: the last reply equals its request", "requests_served": 9}
    rows.append(rpc)
    make_run(out / "results", rows)
    port = {"port": 1, "state": "ACTIVE", "link_layer": "Ethernet", "lid": 0,
            "gids": [[1, "0000:0000:0000:0000:0000:ffff:0a4d:0001", "RoCE v2"]], "netdev": "x"}
    (out / "probe.json").write_text(json.dumps({"inventory": {"rdma": {"devices": [
        {"name": "rxe0", "ports": [port], "limits": LIMITS}], "verbs": True, "reason": ""}}}))
    (out / "run.rc").write_text("0\n")
    (out / "perftest.rc").write_text("0\n")
    (out / "perftest.txt").write_text(
        "rdma-write median vs ib_write_lat t_typical 10.00 5.00 2.00\n"
        "rdma-read median vs ib_read_lat t_typical 10.00 10.00 1.00\n")
    return out


def test_the_facts_hold_on_what_a_good_guest_writes(tmp_path):
    facts, problems = vm_rdma.check(_guest(tmp_path))
    assert not problems and len(facts) == 2 + 1 + 12 + 1 + 1 + 1


@pytest.mark.parametrize("damage", [{"bad_check": "rdma-read 1024x160B batched"},
                                    {"wrong_requests": "rdma-write 128x20KiB batched"}])
def test_a_failed_check_or_a_wrong_split_is_a_failed_fact(tmp_path, damage):
    _, problems = vm_rdma.check(_guest(tmp_path, **damage))
    assert len(problems) == 1
