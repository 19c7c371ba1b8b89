"""chase (the ring is one cycle over every line), --threads (the barrier starts every thread,
aggregate bandwidth from declared bytes), loaded-chase (traffic runs and is counted)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from nearlocal.core import cases as case_rules
from nearlocal.core.cases import Case
from nearlocal.core.methods import SessionContext, get_method, load_methods
from nearlocal.core.sampling import summarize
from nearlocal.cpu.threads import (
    THREAD_FORMS,
    ThreadedSession,
    apply_thread_args,
    choose_cpus,
    run_pinned,
    split_frags,
)
from nearlocal.engine.worker import open_case
from nearlocal.errors import UsageError
from nearlocal.kernels.chase import WORDS_PER_LINE, build_ring, random_order, time_chase, walk
from nearlocal.probe import probe
from nearlocal.sysroot import SysRoot
from tests.fakesys import cxl_box, write

CPUS = sorted(os.sched_getaffinity(0))


def form_of(method: str):
    """The multi-thread form `method` declared where it registers."""
    load_methods()
    return THREAD_FORMS[method]
TSC_HZ = 1e9
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs this process may use")
OTHER_NODE_CPUS = [4096, 4097]  # CPUs of a second node, which this process never runs on


def live_cpus_box(root: Path) -> Path:
    """The fake CXL box laid around this box's CPUs: every CPU this process may use is node 0's,
    node 2 has two others (OTHER_NODE_CPUS), node 1 is the CPU-less pool. Whatever CPU the test
    runs on, `dram` faults its pages on node 0, so the CPUs chosen near it are known."""
    cxl_box(root)
    write(root, "/sys/devices/system/node/node0/cpulist", ",".join(map(str, CPUS)))
    write(root, "/sys/devices/system/node/node0/distance", "10 21 20")
    write(root, "/sys/devices/system/node/node1/distance", "21 10 30")
    write(root, "/sys/devices/system/node/node2/cpulist", "{}-{}".format(*OTHER_NODE_CPUS))
    write(root, "/sys/devices/system/node/node2/meminfo", "Node 2 MemTotal:       1000000 kB")
    write(root, "/sys/devices/system/node/node2/distance", "20 30 10")
    return root


@pytest.mark.parametrize("n", [1, 2, 3, 64, 1000, 4097])
@pytest.mark.parametrize("seed", [1, 7])
def test_random_order_makes_one_cycle_over_every_line(n, seed):
    order = random_order(n, seed)
    succ = [0] * n  # the ring's successor of each line: order[k] -> order[k + 1]
    for k in range(n):
        succ[int(order[k])] = int(order[(k + 1) % n])
    assert sorted(succ) == list(range(n))  # a permutation
    seen, p = [], 0
    for _ in range(n):
        seen.append(p)
        p = succ[p]
    assert p == 0 and len(set(seen)) == n  # back at the start only after visiting every line
    if n > 1:
        assert all(succ[i] != i for i in range(n))


def test_random_order_is_uniform():
    # every one of the 3! orders of 3 lines, and each line's place in a bucketed order of
    # 2 buckets' worth of lines, come up equally often (chi-square, fixed seeds)
    from scipy.stats import chisquare

    from nearlocal.kernels.chase import BUCKET_LINES

    counts = {}
    for seed in range(3000):
        key = tuple(random_order(3, seed))
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == 6 and chisquare(list(counts.values())).pvalue > 1e-3
    n = 2 * BUCKET_LINES
    first_half = sum(int(np.sum(random_order(n, seed)[: n // 2] < 8)) for seed in range(400))
    assert abs(first_half / (400 * 8) - 0.5) < 0.05  # line 0..7 land in either half alike


def test_ring_in_memory_visits_every_line_once():
    lines = 777
    words = np.zeros(lines * WORDS_PER_LINE, np.uint64)
    build_ring(words, lines, seed=3)
    visited, p = set(), 0
    for _ in range(lines):
        assert p % WORDS_PER_LINE == 0  # every pointer is the first word of a line
        visited.add(int(p) // WORDS_PER_LINE)
        p = int(words[p])
    assert p == 0 and visited == set(range(lines))
    assert walk(words, 0, lines) == 0 and walk(words, 0, lines - 1) != 0
    samples, position = np.zeros(5, np.uint64), np.zeros(1, np.uint64)
    time_chase(words, lines, samples, position)
    assert position[0] == 0 and (samples > 0).all()  # 5 whole laps end where they began


def test_ring_must_fit():
    with pytest.raises(ValueError):
        build_ring(np.zeros(8, np.uint64), 2)


def test_chase_session_rows_say_page_size_and_per_load():
    load_methods()
    case = Case("chase", "dram", pattern="64KiB", params=(("hops", "1000"),))
    with open_case(case, TSC_HZ, 0.0, allow_write=False) as opened:
        raw, ns = opened.session.sample(4)
        info = opened.info
    assert info["page_size"] == "4K" and info["ring_lines"] == 1024
    assert info["hops_per_sample"] == 1000 and "dependent loads" in info["timed"]
    assert np.allclose(ns, raw.astype(float) / 1000)  # per load: ticks / hops at 1 GHz
    assert get_method("chase").bytes_moved(opened.pattern) == 0  # a latency, no GB/s


def test_chase_on_memory_it_did_not_create_needs_allow_write(tmp_path):
    path = tmp_path / "pool"
    path.write_bytes(b"\1" * 65536)
    inventory = probe(calibrate=False, gpu=False)
    case = Case("chase", f"file:{path}", pattern="64KiB")
    assert "--allow-write" in case_rules.unavailable(case, inventory, allow_write=False)
    assert case_rules.unavailable(case, inventory, allow_write=True) is None
    with pytest.raises(UsageError, match="fragment pattern"), \
            open_case(Case("chase", "dram", pattern="4x64B"), TSC_HZ, 0.0, False):
        pass


def test_split_frags_shares_the_declared_bytes():
    one = np.array([[0, 4096, 10 * 64 + 5]], np.int64)
    parts = split_frags(one, 3)
    assert sum(int(p[0, 2]) for p in parts) == 645
    assert [int(p[0, 0]) for p in parts] == [0, 192, 384]  # cut on lines
    assert all(int(p[0, 1]) - int(p[0, 0]) == 4096 for p in parts)
    many = np.arange(30, dtype=np.int64).reshape(10, 3)
    assert sum(p.shape[0] for p in split_frags(many, 4)) == 10
    with pytest.raises(UsageError, match="at least one"):
        split_frags(np.array([[0, 0, 128]], np.int64), 3)


def test_choose_cpus_from_the_regions_node(tmp_path):
    root = SysRoot(cxl_box(tmp_path))
    assert choose_cpus("numa:1", "all", "", root, {0, 1}) == [0, 1]  # CPU-less: nearest node
    assert choose_cpus("dram:node=0", "1", "", root, {0, 1}) == [0]
    assert choose_cpus("dram", "2", "1,0", root, {0, 1}) == [1, 0]
    with pytest.raises(UsageError, match="3 threads need 3 distinct CPUs"):
        choose_cpus("numa:1", "3", "", root, {0, 1})
    with pytest.raises(UsageError, match="may not use"):
        choose_cpus("dram", "1", "5", root, {0, 1})
    with pytest.raises(UsageError, match="malformed --threads"):
        choose_cpus("dram", "0", "", root, {0, 1})


def test_dram_threads_run_on_the_node_this_process_runs_on(tmp_path):
    """dram's pages are where the worker runs: its threads take that node's CPUs, never every
    CPU the process may use (the other node's here), and a CPU-less node lends its nearest."""
    root = SysRoot(live_cpus_box(tmp_path))
    allowed = {*CPUS, *OTHER_NODE_CPUS}
    assert choose_cpus("dram", "all", "", root, allowed) == CPUS
    assert choose_cpus("dram", "1", "", root, allowed) == CPUS[:1]
    assert choose_cpus("numa:2", "all", "", root, allowed) == OTHER_NODE_CPUS
    assert choose_cpus("numa:1", "all", "", root, allowed) == CPUS  # nearest: node 0
    with pytest.raises(UsageError, match=f"{len(CPUS) + 1} threads need"):
        choose_cpus("dram", str(len(CPUS) + 1), "", root, allowed)


def test_apply_thread_args_keeps_threadable_methods():
    load_methods()
    cases = [Case(m, "dram", pattern="1MiB") for m in ("load", "chase", "clflush-load", "memcpy")]
    kept = apply_thread_args(cases, "2", None)
    assert [c.method for c in kept] == ["load", "memcpy"]
    assert all(c.param_dict["threads"] == "2" for c in kept)
    assert apply_thread_args(cases, None, "0")[0].param_dict == {"threads": "all", "cpus": "0"}
    with pytest.raises(UsageError, match="multi-thread form"):
        apply_thread_args(cases[1:3], "2", None)
    with pytest.raises(UsageError, match="malformed --cpus"):
        apply_thread_args(cases, "2", "a-b")


def _threaded_ctx(pattern_size: int, threads: str, cpus: str = "",
                  inventory=None) -> SessionContext:
    from nearlocal.core.patterns import parse_pattern
    from nearlocal.regions import parse_region
    from nearlocal.regions.base import MappedRegion

    load_methods()
    case = Case("load", "dram", pattern=str(pattern_size),
                params=(("threads", threads), ("cpus", cpus)))
    src = np.full(pattern_size, 3, np.uint8)
    dst = np.zeros(pattern_size, np.uint8)
    spec = parse_region("dram")
    return SessionContext(case, parse_pattern(str(pattern_size)), MappedRegion(spec, "wb", src, True),
                          MappedRegion(spec, "wb", dst, True), TSC_HZ, 0.0,
                          {**get_method("load").params, **case.param_dict}, inventory)


def test_aggregate_bandwidth_is_declared_bytes_over_first_start_to_last_end():
    ctx = _threaded_ctx(4096, "1", str(CPUS[0]))
    session = ThreadedSession(form_of("load"), ctx)
    session.cpus, session.shares = [CPUS[0]] * 2, split_frags(ctx.pattern.frags, 2)
    session.share_bytes, session.per_thread = [2048, 2048], [[], []]

    def fake_kernel(src, dst, frags, gate, n_threads, starts, ends, sink):  # a test double
        k = 0 if frags[0, 0] == 0 else 1
        starts[:] = [100, 5000][k] + np.arange(starts.size) * 10_000
        ends[:] = starts + [1000, 1500][k]

    session.kernel = fake_kernel
    _, ns = session.sample(3)
    assert list(ns) == [6400.0, 6400.0, 6400.0]  # 5000 + 1500 - 100
    per = session.info["per_thread"]
    assert [r["median_ns"] for r in per] == [1000.0, 1500.0]
    assert [r["gbps"] for r in per] == pytest.approx([2048 / 1000, 2048 / 1500])
    assert summarize(ns, get_method("load").bytes_moved(ctx.pattern))["gbps"] == \
        pytest.approx(4096 / 6400)


@two_cpus
def test_barrier_starts_every_thread_together():
    from nearlocal.kernels.parallel import threaded_kernel

    kernel = threaded_kernel(form_of("store"))
    count, reps = 2, 200
    src = np.zeros(1 << 16, np.uint8)
    dst = np.zeros(1 << 16, np.uint8)
    shares = split_frags(np.array([[0, 0, 1 << 16]], np.int64), count)
    gate = np.zeros(1, np.uint64)
    starts = np.zeros((count, reps), np.uint64)
    ends = np.zeros((count, reps), np.uint64)
    sinks = np.zeros((count, 1), np.uint64)
    run_pinned([(cpu, (lambda k=k: kernel(src, dst, shares[k], gate, count, starts[k], ends[k],
                                          sinks[k])))
                for k, cpu in enumerate(CPUS[:count])])
    assert int(gate[0]) == count * reps  # every thread arrived at every repetition's barrier
    assert (dst == 0x5A).all()  # both shares written
    # nobody starts repetition r+1 before everybody has finished repetition r
    assert (starts[:, 1:].min(axis=0) >= ends[:, :-1].max(axis=0)).all()


@two_cpus
def test_threaded_session_runs_on_distinct_cpus(tmp_path):
    """Two threads on dram, in a run whose inventory puts every CPU of this process on one node
    (whatever the box's own shape): the node's first two CPUs, one thread each."""
    inventory = probe(SysRoot(live_cpus_box(tmp_path)), calibrate=False, gpu=False)
    ctx = _threaded_ctx(1 << 16, "2", inventory=inventory)
    session = ThreadedSession(form_of("load"), ctx)
    _, ns = session.sample(5)
    assert len(ns) == 5 and (ns > 0).all()
    assert session.info["threads"] == 2 and session.info["cpus"] == CPUS[:2]
    assert sum(r["bytes"] for r in session.info["per_thread"]) == 1 << 16


@two_cpus
def test_loaded_chase_counts_traffic_while_it_chases():
    load_methods()
    case = Case("loaded-chase", "dram", pattern="1MiB",  # two CPUs named: any box's shape
                params=(("hops", "2000"), ("threads", "2"), ("cpus", f"{CPUS[0]},{CPUS[1]}"),
                        ("burst", "4KiB")))
    with open_case(case, TSC_HZ, 0.0, allow_write=False) as opened:
        assert (opened.session.progress > 0).all()  # traffic runs before the chase starts
        for _ in range(200):  # on a loaded box the traffic thread may sit out a short batch
            _, ns = opened.session.sample(20)
            if opened.session.bursts:
                break
        info = opened.info
    assert (ns > 0).all() and info["traffic_threads"] == 1
    assert info["chase_cpu"] == CPUS[0] and info["cpus"] == CPUS[:2]
    assert info["share_bytes"] == 512 * 1024 and info["ring_lines"] == 8192
    assert info["traffic_gbps"] > 0  # bursts finished while the chase was timing were counted


def test_loaded_chase_bad_params():
    load_methods()
    method = get_method("loaded-chase")
    for bad in ({"traffic": "memcpyy"}, {"delay": "-1"}, {"burst": "100"}, {"threads": "x"}):
        with pytest.raises(UsageError):
            method.check_params({**method.params, **bad})
    for burst in ("0", "1x", "-1"):  # issue 37: the error names the parameter, not just a size
        with pytest.raises(UsageError, match=f"--param burst='{burst}'"):
            method.check_params({**method.params, "burst": burst})


def test_too_many_threads_is_bad_input(capsys):
    from nearlocal.frontends.cli import main

    assert main(["run", "--method", "load", "--size", "1MiB", "--threads", "9999",
                 "--out", "/nonexistent-never-created"]) == 2
    assert "9999 threads need 9999 distinct CPUs" in capsys.readouterr().err
    assert main(["run", "--method", "chase", "--size", "1MiB", "--threads", "2"]) == 2
    assert main(["run", "--method", "load", "--threads", "0"]) == 2


@two_cpus
def test_threaded_row_through_the_cli(tmp_path):
    from nearlocal.frontends.cli import main
    from nearlocal.store import load

    cpus = f"{CPUS[0]},{CPUS[1]}"  # named: dram's node may hold one CPU on another box
    assert main(["run", "--method", "nt-store", "--method", "chase", "--size", "1MiB",
                 "--threads", "2", "--cpus", cpus, "--budget", "0.05", "--out", str(tmp_path),
                 "--quiet"]) == 0
    run = load(None, tmp_path)
    assert list(run.cases["method"]) == ["nt-store"]  # chase has no multi-thread form
    row = run.cases.iloc[0]
    assert row["status"] == "ok" and row["case_id"] == f"nt-store/dram/wb/1MiB/cpus={cpus}/threads=2"
    assert row["gbps"] == pytest.approx(row["bytes_moved"] / row["median_ns"])
    assert [t["bytes"] for t in row["info"]["per_thread"]] == [512 * 1024] * 2
    assert list(row["info"]["cpus"]) == CPUS[:2]


def test_page_size_the_row_states():
    from nearlocal.cpu.chase import _page_size

    assert _page_size({"pages": "2M"}) == "2M"
    assert _page_size({"align": 2 << 20, "device": "/dev/dax0.0"}) == "2M"  # devdax alignment
    assert _page_size({"path": "/dev/shm/x"}) == "4K"
    load_methods()
    with open_case(Case("chase", "dram:thp", pattern="4MiB"), TSC_HZ, 0.0, False) as opened:
        assert opened.info["page_size"].startswith("thp (")  # the share really in 2 MiB pages


@pytest.mark.parametrize("method", ["memcpy", "nt-copy", "load"])
def test_threaded_copy_warms_its_source_first(method):
    """As cpu.time_memcpy / time_nt_copy: one untimed load_pass over the share before the first
    barrier; its xor lands in sink[0] (zero repetitions: only the warm-up runs)."""
    from nearlocal.kernels.cpu import load_pass
    from nearlocal.kernels.parallel import threaded_kernel

    assert form_of(method).warm
    rng = np.random.default_rng(3)
    src = rng.integers(0, 256, 1 << 14, dtype=np.uint8)
    dst = np.zeros(1 << 14, np.uint8)
    frags = np.array([[0, 0, 1 << 14]], np.int64)
    expected = int(load_pass(src, dst, frags))
    assert expected != 0
    sink = np.zeros(1, np.uint64)
    none = np.zeros(0, np.uint64)
    threaded_kernel(form_of(method))(src, dst, frags, np.zeros(1, np.uint64), 1, none, none, sink)
    assert int(sink[0]) == expected  # the warm-up read the whole share of src
    assert (dst == 0).all()  # and no timed pass ran


@pytest.mark.parametrize("method", ["store", "nt-store"])
def test_threaded_writers_read_nothing_first(method):
    from nearlocal.kernels.parallel import threaded_kernel

    assert not form_of(method).warm
    sink = np.full(1, 7, np.uint64)
    none = np.zeros(0, np.uint64)
    src = np.ones(4096, np.uint8)
    threaded_kernel(form_of(method))(src, np.zeros(4096, np.uint8), np.array([[0, 0, 4096]], np.int64),
                            np.zeros(1, np.uint64), 1, none, none, sink)
    assert int(sink[0]) == 7


def test_threaded_drain_other_than_before_is_bad_input(capsys):
    from nearlocal.frontends.cli import main

    load_methods()
    method = get_method("load")
    with pytest.raises(UsageError, match="drain=none does not apply"):
        method.check_params({**method.params, "threads": "2", "drain": "none"})
    method.check_params({**method.params, "threads": "1", "drain": "none"})  # one thread: fine
    assert main(["run", "--method", "load", "--size", "1MiB", "--cpus", str(CPUS[0]),
                 "--param", "drain=none", "--out", "/nonexistent-never-created"]) == 2
    err = capsys.readouterr().err
    assert "drain=none does not apply" in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists("/nonexistent-never-created")


def test_threaded_row_records_barrier_start_skew():
    ctx = _threaded_ctx(4096, "1", str(CPUS[0]))
    session = ThreadedSession(form_of("load"), ctx)
    session.cpus, session.shares = [CPUS[0]] * 2, split_frags(ctx.pattern.frags, 2)
    session.share_bytes, session.per_thread = [2048, 2048], [[], []]

    def fake_kernel(src, dst, frags, gate, n_threads, starts, ends, sink):  # a test double
        k = 0 if frags[0, 0] == 0 else 1
        starts[:] = np.arange(starts.size) * 10_000 + [0, 200][k] + np.arange(starts.size) * k
        ends[:] = starts + 1000

    session.kernel = fake_kernel
    session.sample(3)
    info = session.info
    assert info["start_skew_median_ns"] == 201.0  # skews 200, 201, 202 at 1 GHz
    assert info["start_skew_max_ns"] == 202.0
    assert info["thread_ticks"] == [{"starts": [[0, 10_000, 20_000], [200, 10_201, 20_202]],
                                     "ends": [[1000, 11_000, 21_000], [1200, 11_201, 21_202]]}]
    session.sample(1)
    assert len(info["thread_ticks"]) == 2 and info["start_skew_max_ns"] == 202.0
