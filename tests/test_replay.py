"""Serving under load, measured (issue 57): movers=k (each mover its own whole pattern, per-mover
samples kept), contention_of (per way and k from rows and raw samples), and `nearlocal replay`
(the trace's prefix hits cut by the layout and really moved, per-request wait and transfer; bad
input one line, exit 2)."""

from __future__ import annotations

import json
import math
import os
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nearlocal.core.cases import Case
from nearlocal.core.methods import SessionContext, get_method, load_methods
from nearlocal.core.patterns import parse_pattern
from nearlocal.cpu.movers import MoversSession, check_mover_params, mover_counts
from nearlocal.cpu.threads import THREAD_FORMS
from nearlocal.errors import UsageError
from nearlocal.frontends.cli import main
from nearlocal.whatif.contention import contention_of
from nearlocal.whatif.traffic import prefix_hits, read_trace
from nearlocal.workloads import replay

CPUS = sorted(os.sched_getaffinity(0))
TSC_HZ = 1e9
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs this process may use")
TINY = "kv:qwen2.5-32b:flash-attn:dense:layers=0-1"  # 2 layers: 4 KiB a token, 2 MiB a slot


def _ctx(size: int, movers: str) -> SessionContext:
    from nearlocal.regions import load_providers, parse_region, region_kind

    load_methods()
    load_providers()
    case = Case("memcpy", "dram", pattern=str(size), params=(("movers", movers),))
    spec = parse_region("dram")
    src = region_kind(spec).open(spec, size, "wb", True)
    dst = region_kind(spec).open(spec, size, "wb", True)
    return SessionContext(case, parse_pattern(str(size)), src, dst, TSC_HZ, 0.0,
                          {**get_method("memcpy").params, **case.param_dict})


def test_movers_param_is_checked():
    check_mover_params({"movers": "2"})
    for bad in ("0", "-1", "x", "1.5"):
        with pytest.raises(UsageError, match="malformed movers"):
            check_mover_params({"movers": bad})
    with pytest.raises(UsageError, match="give one of them"):
        check_mover_params({"movers": "2", "threads": "2"})
    load_methods()
    assert "movers" in get_method("memcpy").params


def test_mover_counts_double_up_to_the_cpus():
    assert mover_counts(1) == [1]
    assert mover_counts(2) == [1, 2]
    assert mover_counts(6) == [1, 2, 4, 6]
    assert mover_counts(64) == [1, 2, 4, 8]


@two_cpus
def test_each_mover_moves_the_whole_pattern_into_its_own_buffer():
    ctx = _ctx(1 << 16, "2")
    session = MoversSession(THREAD_FORMS["memcpy"], ctx)
    try:
        ticks, ns = session.sample(6)
        assert ticks.shape == ns.shape == (6,)
        assert (ns > 0).all()
        src, dst, size = session.src.array, session.dst.array, 1 << 16
        assert src.size >= 2 * size and dst.size >= 2 * size
        assert (dst[:size] == src[:size]).all()  # mover 0: its slots into its buffer
        assert (dst[size:2 * size] == src[size:2 * size]).all()  # mover 1: its own, apart
        assert not (src[:size] == src[size:2 * size]).all()  # two different sources
        info = session.info
        assert info["movers"] == 2 and len(set(info["cpus"])) == 2
        assert [len(s) for s in info["mover_samples_ns"]] == [6, 6]
        assert info["aggregate_gbps"] > 0 and len(info["per_mover"]) == 2
    finally:
        session.close()
        ctx.src.close()
        ctx.dst.close()


def _row(k: int, median: float, **extra) -> dict:
    params = json.dumps({"movers": str(k)}) if k > 1 else "{}"
    return {"case_id": f"memcpy/dram/{k}", "method": "memcpy", "region": "dram",
            "pattern": "kv:x", "params": params, "status": "ok", "median_ns": median,
            "bytes_moved": 1000, "pool_class": "local", "peer_pool_class": "local", **extra}


def test_contention_of_gives_per_mover_and_aggregate_per_k_from_raw_samples():
    info = {"bytes_per_mover": 1000, "aggregate_gbps": 1.5,
            "mover_samples_ns": [[1000.0, 1200.0], [1400.0, 1600.0, 5000.0]]}
    rows = [_row(1, 500.0), _row(2, 1300.0, info=json.dumps(info)),
            _row(2, 9.0, params=json.dumps({"threads": "2"}), case_id="split"),  # one request
            {**_row(1, 100.0), "pattern": "other", "case_id": "other size"}]
    samples = {"memcpy/dram/1": [400.0, 500.0, 600.0]}
    out = contention_of(rows, samples)
    assert list(out) == ["host-gather/memcpy"]
    way = out["host-gather/memcpy"]
    assert sorted(way) == [1, 2]
    assert way[1]["per_mover_gbps"] == pytest.approx(1000 / 500.0)
    assert way[1]["service_ns"]["n"] == 3
    assert way[2]["service_ns"]["n"] == 5  # every mover's samples (no store samples given)
    assert way[2]["service_ns"]["p50_ns"] == pytest.approx(1400.0)
    assert way[2]["per_mover_gbps"] == pytest.approx(1000 / 1400.0)
    assert way[2]["aggregate_gbps"] == 1.5
    assert way[2]["rows"] == ["memcpy/dram/2"]


def test_replay_takes_the_simulations_reader_and_prefix_rule(tmp_path):
    ids = [[1, 2, 3], [1, 2, 4, 3], [5, 1], [1, 2, 4, 3, 9]]
    path = _trace(tmp_path, [{"timestamp": 10 * n, "input_length": 512 * len(h),
                              "output_length": 1, "hash_ids": h} for n, h in enumerate(ids)])
    assert prefix_hits(read_trace(path)).blocks.tolist() == [0, 2, 0, 4]
    out = tmp_path / "replay.json"
    assert main(["replay", "--trace", path, "--layers", "0-1", "--seconds", "1",
                 "--out", str(out), "--pool-bytes", "512MiB"]) == 0
    records = json.loads(out.read_text())["per_request"]
    assert [r["hit_tokens"] for r in records] == [0, 1024, 0, 2048]
    assert [r["fragments"] > 0 for r in records] == [False, True, False, True]


def test_a_request_is_cut_by_the_layout_and_its_blocks_lie_apart():
    pool = replay.pool_for(TINY, 64 << 20)
    assert pool.region_bytes > 64 << 20
    table, cursor = replay.request_table(pool, 512 + 100, 0)
    assert cursor == 2
    assert table.size == 32 + 7  # a whole 512-token block, then 100 tokens in 16-token blocks
    first_slot, second_slot = table[0] // pool.per_slot, table[32] // pool.per_slot
    assert abs(int(first_slot) - int(second_slot)) > 1
    frags, first, nbytes = replay.cut_requests(pool, [table, np.zeros(0, np.int64)], 1 << 20)
    token_bytes = pool.block_bytes // pool.geometry.block_tokens
    assert nbytes.tolist() == [39 * 16 * token_bytes, 0]
    assert first.tolist() == [0, frags.shape[0], frags.shape[0]]
    assert frags.shape[0] == 2 * 2 * 2  # 2 layers x K, V x 2 runs of blocks
    assert ((frags[:, 1] + frags[:, 2]) <= 1 << 20).all()  # wrapped into the mover's buffer
    assert ((frags[:, 0] + frags[:, 2]) <= pool.region_bytes).all()


@pytest.mark.parametrize("layout", ["flash-attn", "flashinfer", "cross-layer"])
@pytest.mark.parametrize("blocks", ["contiguous", "scattered"])
def test_a_slot_is_read_again_only_after_the_other_slots_even_in_one_long_request(layout, blocks):
    """A request of many more 512-token blocks than the pool has slots: between two reads of the
    same pool bytes lie (nearly) the rest of the pool's bytes, so a reload comes from memory,
    not from the LLC the last read of that slot filled (cut layer by layer, each layer's few
    slots were read again straight away and the replay outran memory)."""
    pool = replay.pool_for(f"kv:qwen2.5-32b:{layout}:dense:layers=0-3", 16 << 20)
    assert pool.slots >= 3
    table, _ = replay.request_table(pool, 512 * 4 * pool.slots, 0, blocks)
    frags, _, nbytes = replay.cut_requests(pool, [table], 64 << 20)
    read_at = np.concatenate([[0], np.cumsum(frags[:, 2])])
    last: dict[int, int] = {}
    closest = None
    for (src, _, size), before in zip(frags.tolist(), read_at[:-1].tolist(), strict=True):
        for page in range(src // 4096, (src + size - 1) // 4096 + 1):
            if page in last:
                gap = before - last[page]
                closest = gap if closest is None else min(closest, gap)
            last[page] = before + size
    slot_bytes = pool.per_slot * pool.block_bytes
    assert nbytes[0] == 4 * pool.slots * slot_bytes
    assert closest is not None and closest >= (pool.slots - 1) * slot_bytes // 2


def test_a_replay_moves_every_request_after_its_arrival():
    pool = replay.pool_for(TINY, 8 << 20)
    tables, cursor = [], 0
    for tokens in (512, 1024, 0, 300):
        table, cursor = replay.request_table(pool, tokens, cursor)
        tables.append(table)
    frags, first, nbytes = replay.cut_requests(pool, tables, 4 << 20)
    arrival = np.array([0.0, 0.001, 0.002, 0.002])
    times = replay.run_replay(frags, first, arrival, pool.region_bytes, 4 << 20, CPUS[:1], TSC_HZ)
    assert (times.start_ns >= times.arrival_ns - 1).all()
    assert (times.end_ns >= times.start_ns - 1).all()
    assert times.mover.tolist() == [0, 0, 0, 0]
    assert (np.diff(times.start_ns) >= 0).all()  # one mover serves them in arrival order
    summary = replay.summarise(times, nbytes, 1)
    assert summary["requests"] == 4 and summary["requests_with_hits"] == 3
    assert summary["reload"]["p50_ns"] is not None
    assert len(summary["per_request"]) == 4


def _trace(tmp_path, lines: list[dict]) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_replay_command_writes_per_request_records(tmp_path, capsys):
    trace = _trace(tmp_path, [
        {"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 10, "input_length": 700, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 20, "input_length": 900, "output_length": 1, "hash_ids": [1, 3]},
    ])
    out, junit = tmp_path / "replay.json", tmp_path / "replay.xml"
    assert main(["replay", "--trace", trace, "--layers", "0-1", "--seconds", "1",
                 "--out", str(out), "--pool-bytes", "512MiB", "--junit", str(junit)]) == 0
    data = json.loads(out.read_text())
    assert data["requests"] == 3 and data["requests_with_hits"] == 2
    case = ET.parse(junit).getroot().find("testsuite").find("testcase")
    assert case.get("name") == "data check" and case.find("skipped") is not None  # host: no check
    assert data["hit_tokens"] == 700 + 512
    assert [r["bytes"] > 0 for r in data["per_request"]] == [False, True, True]
    assert [r["hit_tokens"] for r in data["per_request"]] == [0, 700, 512]
    assert data["reload"]["p99_ns"] >= data["reload"]["p50_ns"] > 0
    assert "reload" in capsys.readouterr().out


def test_replay_junit_holds_the_data_check():
    """--method rdma-read's data check is the replay's verdict: a JUnit case, failed where the
    bytes differ (the exit code's rule), passed where they agree."""
    from nearlocal.frontends.replay import REPLAY_FORMATS, data_check_failed

    base = {"trace": "t.jsonl", "path": "rdma-read", "movers": 2, "wall_s": 1.5}
    for check, outcome in (("ok: 4096 bytes in 2 fragments", None),
                           ("FAILED: 3 of 4096 bytes differ from rank 1's", "failure")):
        data = {**base, "data_check": check}
        root = ET.fromstring(REPLAY_FORMATS["junit"].report(data).split("?>", 1)[1])
        case = root.find("testsuite").find("testcase")
        assert (case.find("failure") is not None) == (outcome == "failure") == \
            data_check_failed(data)


@pytest.mark.parametrize("argv, words", [
    (["--trace", "/nonexistent/trace.jsonl"], "no such file"),
    (["--seconds", "0"], "--seconds"),
    (["--seconds", "-3"], "--seconds"),
    (["--movers", "0"], "--movers"),
    (["--movers", str(len(CPUS) + 1)], "--movers"),
    (["--model", "no-such-model"], "model"),
    (["--time-scale", "0"], "--time-scale"),
    (["--pool-bytes", "1MiB"], "4x the LLC"),
    (["--load", "1.5"], "--load"),
    (["--load", "0.5", "--time-scale", "2"], "not both"),
    (["--start", "100"], "--start"),
    (["--trace", "BAD"], ":1: missing field 'output_length'"),
    (["--region", "nosuch"], "unknown region"),
    (["--region", "devdax:/dev/null"], "not a device-dax"),
    (["--region", "gpu:0"], "not gpu memory"),
])
def test_replay_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, words):
    trace = _trace(tmp_path, [{"timestamp": 0, "input_length": 10, "output_length": 1,
                               "hash_ids": [1]}])
    if "BAD" in argv:
        argv = ["--trace", _trace(tmp_path, [{"timestamp": 0, "input_length": 10,
                                              "hash_ids": [1]}])]
    assert main(["replay", "--trace", trace, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


def test_replay_load_sets_the_time_scale_from_a_calibration(tmp_path):
    trace = _trace(tmp_path, [
        {"timestamp": t, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}
        for t in (0, 100, 200)])
    out = tmp_path / "replay.json"
    assert main(["replay", "--trace", trace, "--layers", "0-1", "--seconds", "1", "--load", "0.5",
                 "--out", str(out), "--pool-bytes", "512MiB"]) == 0
    data = json.loads(out.read_text())
    calibration = data["calibration"]
    assert calibration["requests"] == 2 and calibration["gbps_per_mover"] > 0
    rounds = calibration["rounds_gbps_per_mover"]
    assert len(rounds) == 3 and calibration["gbps_per_mover"] == sorted(rounds)[1]
    expected = data["bytes"] / (0.5 * calibration["gbps_per_mover"] * 1e9)
    assert data["time_scale"] == pytest.approx(expected)


def _small_llc(monkeypatch, llc: int = 1 << 20) -> None:
    """The replay sized by an LLC of `llc` (4 MiB the floor, 8 MiB the default pool)."""
    from nearlocal.frontends import replay as front

    hz, _, cpus = front.replay_box()
    monkeypatch.setattr(front, "replay_box", lambda: (hz, llc, cpus))


def _holding(monkeypatch, nbytes: int) -> None:
    """file: regions hold `nbytes` (as a device holds its size)."""
    from dataclasses import replace

    from nearlocal.regions.base import REGION_KINDS, load_providers

    load_providers()
    monkeypatch.setitem(REGION_KINDS, "file", replace(
        REGION_KINDS["file"], capacity=lambda spec: (nbytes, "the test's device")))


def _three_requests(tmp_path) -> str:
    return _trace(tmp_path, [
        {"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 10, "input_length": 700, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 20, "input_length": 900, "output_length": 1, "hash_ids": [1, 3]}])


def test_replay_reads_a_users_pool_and_never_writes_it(tmp_path, monkeypatch):
    _small_llc(monkeypatch)
    pool = tmp_path / "pool"
    content = np.random.default_rng(1).integers(0, 256, 16 << 20, dtype=np.uint8).tobytes()
    pool.write_bytes(content)  # the user's file: opened read-only, never written
    out = tmp_path / "replay.json"
    assert main(["replay", "--trace", _three_requests(tmp_path), "--layers", "0-1",
                 "--seconds", "1", "--region", f"file:{pool}", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["region"] == f"file:{pool}" and f"file:{pool} pool" in data["path"]
    assert data["source"]["owned"] is False and data["source"]["region"] == f"file:{pool}"
    assert data["memory_figure"] and data["pool_note"] is None and "fenced rdtscp" in data["timed"]
    assert data["pool_bytes"] > 4 << 20
    moved = [r for r in data["per_request"] if r["bytes"]]
    assert len(moved) == 2 and all(r["transfer_ns"] > 0 and r["mover"] == 0 for r in moved)
    assert pool.read_bytes() == content


def test_a_dram_replay_is_the_host_gather():
    from nearlocal.frontends.replay import source_of

    pool_class, path, _ = source_of("dram")
    assert pool_class == "local" and path.startswith("host-gather (memcpy, dram pool")


def test_a_region_below_the_floor_replays_only_when_asked_and_marked(tmp_path, monkeypatch,
                                                                     capsys):
    from nearlocal.frontends.replay import CACHE_RESIDENT, choose_pool

    _small_llc(monkeypatch)
    _holding(monkeypatch, 4 << 20)  # no more than 4x the LLC: no memory figure fits
    pool = tmp_path / "pool"
    pool.write_bytes(bytes(16 << 20))
    argv = ["replay", "--trace", _three_requests(tmp_path), "--layers", "0-0", "--seconds", "1",
            "--region", f"file:{pool}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds 4MiB" in err and "--pool-bytes" in err
    assert CACHE_RESIDENT in err
    fits, _, _ = choose_pool("kv:qwen2.5-32b:flash-attn:dense:layers=0-0", 1 << 20, "3MiB",
                             f"file:{pool}")
    assert fits.region_bytes <= 4 << 20
    out = tmp_path / "replay.json"
    assert main([*argv, "--pool-bytes", "3MiB", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert not data["memory_figure"] and data["pool_note"].startswith(CACHE_RESIDENT)
    assert f"NOTE: {CACHE_RESIDENT}" in capsys.readouterr().out


@pytest.mark.parametrize("holds, pool_bytes, words", [
    (64 << 20, "2MiB", "more than 4x the LLC"),  # the region holds a memory figure: the rule stands
    (6 << 20, None, "holds 6MiB, the pool spans 12MiB (8x the LLC of 1MiB)"),
    (6 << 20, "16MiB", "holds 6MiB, the pool spans 20MiB (--pool-bytes 16MiB)"),
])
def test_a_pool_the_region_cannot_hold_is_refused_naming_sizes(tmp_path, monkeypatch, holds,
                                                               pool_bytes, words):
    from nearlocal.frontends.replay import choose_pool

    _holding(monkeypatch, holds)
    with pytest.raises(UsageError, match=re.escape(words)):
        choose_pool("kv:qwen2.5-32b:flash-attn:dense:layers=0-1", 1 << 20, pool_bytes,
                    f"file:{tmp_path / 'pool'}")


@given(st.integers(1, 1 << 20))
def test_the_scatter_step_is_a_bijection_over_any_pool(count):
    """`--blocks scattered` maps a slot's ids by `id x step mod count`: for every pool size the
    step is coprime to it (no two ids land on one block) and lies within it."""
    step = replay.scatter_step(count)
    assert 1 <= step <= max(count - 1, 1) and math.gcd(step, count) == 1
    if count <= 4096:
        assert sorted((np.arange(count) * step) % count) == list(range(count))
