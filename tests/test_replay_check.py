"""scripts/replay_check.py's comparison (issue 57 item 3): the simulation fed a replay's own
requests, P50 within 15 % and P99 within 25 %, exit 1 when a load fails; synthetic replay
records, no box measurement."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nearlocal.errors import UsageError
from nearlocal.whatif.load import link_contention

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "replay_check.py"
spec = importlib.util.spec_from_file_location("replay_check", SCRIPT)
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def _replay(arrival_s, wait_s, transfer_s, movers=1, nbytes=None) -> dict:
    nbytes = nbytes or [1 << 20] * len(arrival_s)
    return {"movers": movers, "load": 0.5, "time_scale": 1.0, "utilisation": 0.5,
            "per_request": [{"arrival_ns": a * 1e9, "wait_ns": w * 1e9, "transfer_ns": t * 1e9,
                             "bytes": b} for a, w, t, b in zip(arrival_s, wait_s, transfer_s,
                                                               nbytes, strict=True)]}


def test_a_replay_the_simulation_serves_alike_passes():
    # one mover: the second request waits for the first, as FIFO has it
    replay = _replay([0.0, 0.05, 1.0, 2.0], [0.0, 0.05, 0.0, 0.0], [0.1, 0.1, 0.2, 0.1])
    entry = check.compare(replay, np.array([0.1, 0.1, 0.2, 0.1]))
    assert entry["pass"] and entry["p50_ratio"] == pytest.approx(1.0)
    assert entry["p99_ratio"] == pytest.approx(1.0)
    assert entry["fit"]["replay_over_predicted"]["p50"] == pytest.approx(1.0)
    assert entry["simulated_from_replay_transfers"]["p99_ratio"] == pytest.approx(1.0)
    assert check.exit_code([entry]) == 0


def test_a_replay_slower_than_the_rows_say_fails_and_exits_1():
    replay = _replay([0.0, 1.0, 2.0], [0.0, 0.0, 0.0], [0.2, 0.2, 0.2])
    entry = check.compare(replay, np.array([0.1, 0.1, 0.1]))  # the fit says half the time
    assert not entry["pass"] and entry["p50_ratio"] == pytest.approx(0.5)
    assert entry["fit"]["replay_over_predicted"]["p50"] == pytest.approx(2.0)
    # the queue model itself is right: fed the replay's transfers it gives the replay back
    assert entry["simulated_from_replay_transfers"]["p50_ratio"] == pytest.approx(1.0)
    good = check.compare(_replay([0.0], [0.0], [0.1]), np.array([0.1]))
    assert check.exit_code([good, entry]) == 1 and check.exit_code([]) == 1


def test_requests_without_hits_are_left_out_of_the_quantiles():
    replay = _replay([0.0, 0.5, 1.0], [0.0, 0.0, 0.0], [0.1, 0.0, 0.1],
                     nbytes=[1 << 20, 0, 1 << 20])
    entry = check.compare(replay, np.array([0.1, 5.0, 0.1]))  # a miss's figure is not used
    assert entry["requests_with_hits"] == 2 and entry["pass"]


def test_g_movers_take_the_rate_measured_at_k():
    contention = {"w": {1: {"per_mover_gbps": 10.0, "rows": ["k1"]},
                        2: {"per_mover_gbps": 5.0, "rows": ["k2"]}}}
    link = link_contention("w", contention)
    # two movers, two reloads at once: each at half a mover's rate alone
    replay = _replay([0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.2, 0.2, 0.1], movers=2)
    alone = np.array([0.1, 0.1, 0.1])
    assert check.compare(replay, alone, link)["pass"]
    assumed = check.compare(replay, alone, None)  # rate 1 at every k: too fast
    assert not assumed["pass"]


def test_a_spread_scales_each_transfer():
    replay = _replay([0.0, 1.0, 2.0, 3.0], [0.0] * 4, [0.2] * 4)
    entry = check.compare(replay, np.full(4, 0.1), spread=np.array([2.0]))
    assert entry["pass"] and entry["simulated_without_spread"]["p50_ratio"] == pytest.approx(0.5)


@pytest.mark.parametrize("argv, words", [
    (["--loads", "0.3,1.5"], "--loads"),
    (["--movers", "0"], "--movers"),
    (["--trace", "/nonexistent.jsonl"], "no such file"),
])
def test_bad_input_is_one_line_exit_2(argv, words, capsys):
    assert check.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


MIB = 1 << 20
TCG = "QEMU TCG CPU version 2.5+"


def _gather_row(region: str, pool_class: str, k: int = 1, median: float = 8e6) -> dict:
    """A stored memcpy row of 80 fragments of 1 MiB out of `region` (k movers)."""
    params = {"movers": str(k)} if k > 1 else {}
    info = {"bytes_per_mover": 80 * MIB, "aggregate_gbps": k * 80 * MIB / median,
            "mover_samples_ns": [[median * 0.99, median, median * 1.01]] * k} if k > 1 else {}
    return {"case_id": f"memcpy/{region}/wb/80x1048576B/read" + (f"/movers={k}" if k > 1 else ""),
            "method": "memcpy", "region": region, "peer": "dram", "attr": "wb", "access": "read",
            "pattern": "80x1048576B", "status": "ok", "reason": "", "measures": "transfer",
            "fragment_count": 80, "fragment_bytes": MIB, "size_bytes": 80 * MIB,
            "bytes_moved": 80 * MIB, "median_ns": median, "params": json.dumps(params),
            "effective_params": json.dumps({"drain": "before", **params}),
            "pool_class": pool_class, "peer_pool_class": "local", "reaches_memory": True,
            "source_reaches_memory": True, "info": json.dumps(info) if info else ""}


def test_the_simulation_takes_the_rows_of_the_replays_region_only():
    rows = [_gather_row("dram", "local"), _gather_row("dram", "local", 2),
            _gather_row("devdax:/dev/dax0.0", "devdax"),
            _gather_row("devdax:/dev/dax0.0", "devdax", 2), _gather_row("shm:x", "shared")]
    run = types.SimpleNamespace(cases=pd.DataFrame(rows))
    way, ids = check.way_of_region(run, "devdax:/dev/dax0.0")
    assert way == "pool-gather/memcpy" and ids == {r["case_id"] for r in rows[2:4]}
    assert check.way_of_region(run, "dram")[0] == "host-gather/memcpy"
    for region in ("numa:1", "shm:x"):  # no rows; rows no hop of the what-if takes
        with pytest.raises(UsageError, match=f"no memcpy rows out of {region}"):
            check.way_of_region(run, region)


def test_the_check_feeds_the_simulation_the_replays_own_requests(tmp_path, monkeypatch, capsys):
    """The whole check on a stored run (`--run`) and a real replay, in this process: the rows of
    the region named, the replay out of it, the same requests on both sides."""
    from nearlocal.frontends import cli
    from nearlocal.frontends import replay as front
    from nearlocal.store.writer import Store

    hz, _, cpus = front.replay_box()
    monkeypatch.setattr(front, "replay_box", lambda: (hz, 1 << 20, cpus))  # an 8 MiB pool
    monkeypatch.setattr(check, "_nearlocal", lambda argv: subprocess.CompletedProcess(
        argv, cli.main(argv), "", ""))
    store = Store.create(tmp_path / "rows", {"host_id": "guest", "inventory": {
        "cpu": {"model": TCG}}})
    for k in (1, 2):
        row = _gather_row("dram", "local", k, 8e6 * k)
        ns = np.array([0.99, 1.0, 1.01]) * row["median_ns"]
        store.add_case(row, ns, ns)
    store.add_case(_gather_row("devdax:/dev/dax0.0", "devdax"), None, None)  # another region's
    store.finish()
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 100 * n, "input_length": 1200,
                                         "output_length": 1, "hash_ids": [1, 2, 3]}) + "\n"
                             for n in range(4)))
    run = next(p for p in (tmp_path / "rows").iterdir() if p.is_dir())
    code = check.main(["--trace", str(trace), "--run", str(run), "--start", "0", "--seconds",
                       "1", "--layers", "0-1", "--loads", "0.5", "--region", "dram",
                       "--out", str(tmp_path / "check"), "--json"])
    text = capsys.readouterr().out  # the replay's own summary, then the check's JSON
    out = json.loads(text[text.index("{\n"):])
    assert code in (0, 1)
    assert out["region"] == "dram" and out["way"] == "host-gather/memcpy"
    assert "emulated box" in out["emulated"]
    assert out["transfer_rows"] == ["memcpy/dram/wb/80x1048576B/read"]
    (entry,) = out["loads"]
    assert all(entry["same_requests"][k] is True
               for k in ("requests", "hit_tokens", "bytes", "fragments"))
    assert entry["requests_with_hits"] == 3 and entry["simulated_reload"]["p50_ns"] > 0
    replay = json.loads(Path(entry["replay_json"]).read_text())
    assert replay["region"] == "dram" and replay["path"].startswith("host-gather")
