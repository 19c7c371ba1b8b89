"""scripts/replay_check.py's comparison (issue 57 item 3): the simulation fed a replay's own
requests, P50 within 15 % and P99 within 25 %, exit 1 when a load fails; synthetic replay
records, no box measurement."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

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
