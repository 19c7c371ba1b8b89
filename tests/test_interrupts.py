"""Issue 13: a run killed part way (SIGKILL, SIGTERM, Ctrl-C to the process group) keeps what it
measured, readable as an incomplete run, and prints no traceback; a closed pipe is no error."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nearlocal.frontends.cli import main
from nearlocal.store import load
from tests.report_fixtures import make_run, row

ROOT = Path(__file__).resolve().parent.parent
SIZES = ",".join(str(64 << k) for k in range(12))  # 12 cases: the run is still going when killed


def _shm(out: Path) -> Path:
    return Path("/dev/shm") / f"nearlocal-i13-test-{os.getpid()}-{out.parent.name[-24:]}"


def _start_run(out: Path) -> subprocess.Popen:
    """A run on a shm: region nearlocal creates per case: it must be gone however the run ends."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "nearlocal", "run", "--method", "load", "--size", SIZES,
         "--region", f"shm:{_shm(out).name}", "--budget", "0.2", "--quiet", "--out", str(out),
         # one process (rows land as cases finish) and a CI no case reaches (each runs its whole
         # budget): >= 2 s still to go after the first row however fast the machine is
         "--processes", "1", "--ci", "0.0001"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
        # a shell's background job (nohup, `&` in a script) starts with SIGINT ignored, and a
        # Python started so never turns Ctrl-C into KeyboardInterrupt: give the run the default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for_cases(out: Path, process: subprocess.Popen, n: int, timeout: float = 120) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(out.glob("*/partial/[0-9]*.json"))
        if len(found) >= n:
            return found[0].parent.parent
        if process.poll() is not None:
            pytest.fail(f"the run ended before {n} cases: {process.communicate()}")
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    pytest.fail("no case stored in time")


def _reap_group(process: subprocess.Popen) -> None:
    """The worker of a killed parent exits on its own (EOF on its pipe); wait for it briefly."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGKILL)


def test_a_sigkilled_run_reads_back_its_cases(tmp_path, capsys):
    out = tmp_path / "r"
    process = _start_run(out)
    path = _wait_for_cases(out, process, 2)
    process.kill()  # the parent only, as the OOM killer would
    process.communicate(timeout=30)
    _reap_group(process)
    assert not _shm(out).exists() and not list(Path("/dev/shm").glob(f".{_shm(out).name}.*"))
    run = load(path.name, out)
    assert not run.complete and "partial" in run.incomplete
    assert len(run.cases) >= 2 and set(run.cases["status"]) <= {"ok", "failed"}
    ok = run.cases[run.cases["status"] == "ok"]
    for case_id, n in zip(ok["case_id"], ok["n_samples"], strict=True):
        assert len(run.samples_of(case_id)) == n  # every stored row has its samples
    assert main(["runs", "--out", str(out)]) == 0
    assert "no: not" in capsys.readouterr().out
    assert main(["show", path.name, "--out", str(out)]) == 0
    assert "incomplete" in capsys.readouterr().err


@pytest.mark.parametrize("how, code", [("term", 143), ("int-group", 130)])
def test_sigterm_and_ctrl_c_store_an_interrupted_run_without_traceback(tmp_path, how, code):
    out = tmp_path / "r"
    process = _start_run(out)
    path = _wait_for_cases(out, process, 1)
    if how == "term":
        process.send_signal(signal.SIGTERM)
    else:
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C reaches the worker too
    _, err = process.communicate(timeout=60)
    _reap_group(process)
    assert process.returncode == code, err
    assert not _shm(out).exists() and not list(Path("/dev/shm").glob(f".{_shm(out).name}.*"))
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    run = load(path.name, out)
    assert run.meta["interrupted"] and not run.meta["complete"] and not run.complete
    assert (path / "cases.parquet").exists() and not (path / "partial").exists()
    assert len(run.cases) >= 1


def test_a_closed_pipe_is_not_a_traceback(tmp_path):
    make_run(tmp_path, [row("load", size=64 + k) for k in range(120)], run_id="big")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        f"{sys.executable} -m nearlocal show big --json --out {tmp_path} | head -c 10",
        shell=True, env=env, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr


def test_ctrl_c_before_the_first_case_is_an_interrupted_run(tmp_path):
    """Issue 37: a Ctrl-C while the fork server starts and loads its modules (the run's store is
    open, no case measured yet) once ended with exit 0 and the run listed as complete, or with
    the fork server's KeyboardInterrupt traceback."""
    out = tmp_path / "r"
    process = _start_run(out)
    deadline = time.monotonic() + 120
    while not list(out.glob("*/partial")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=60)
    _reap_group(process)
    assert process.returncode == 130, (process.returncode, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    for path in out.glob("*/run.json"):
        assert load(path.parent.name, out).meta["interrupted"]
    assert all((path / "run.json").exists() for path in out.iterdir())  # no half-started run


def test_sigterm_as_the_run_starts_leaves_no_run_without_its_run_json(tmp_path, capsys):
    """Issue 49: a SIGTERM the moment the run's directory appears (partial/ made, run.json not
    yet written) left a directory no command listed or read. Now either nothing is left or an
    interrupted run that every command reads."""
    out = tmp_path / "r"
    process = _start_run(out)
    deadline = time.monotonic() + 120
    while not list(out.glob("*/partial")) and process.poll() is None and time.monotonic() < deadline:
        pass  # no sleep: the signal lands before run.json is written, as a CI runner's may
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    _reap_group(process)
    assert process.returncode == 143, (process.returncode, err)
    assert "Traceback" not in err, err
    left = list(out.iterdir())
    assert all((path / "run.json").exists() for path in left), [
        sorted(p.name for p in path.iterdir()) for path in left]
    for path in left:
        assert load(path.name, out).meta["interrupted"]


def test_a_run_killed_before_its_run_json_is_listed_and_named(tmp_path, capsys):
    """A SIGKILL (or power loss) between Store.create's mkdir of partial/ and its run.json leaves
    the directory as made here: `runs` lists it with its id and start, `show` names it, and
    neither reads it as a run."""
    out = tmp_path / "r"
    make_run(out, [row("load")], run_id="20260101T000000-good")
    (out / "20260102T030405-c0ffee" / "partial").mkdir(parents=True)
    assert main(["runs", "--out", str(out)]) == 0
    listed = capsys.readouterr().out
    line = next(line for line in listed.splitlines() if "c0ffee" in line)
    assert "2026-01-02T03:04:05+0000" in line and "no: stopped before it started" in line, line
    assert " run " not in line  # its kind is not known without its run.json
    assert main(["show", "20260102T030405-c0ffee", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("nearlocal: error: run 20260102T030405-c0ffee was stopped before it "
                          "started (no run.json): nothing measured; `nearlocal runs "
                          "--remove-unstarted")
    assert "\n" not in err
    assert load("latest", out).run_id == "20260101T000000-good"  # never taken for a run
    # removable with the tool: only once it is older than a run's own start could be, and
    # never a directory holding anything but partial/
    young = out / "20260103T000000-beef00"
    (young / "partial").mkdir(parents=True)
    foreign = out / "20260104T000000-f00d00"
    (foreign / "partial").mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    old = time.time() - 3600
    for path in (out / "20260102T030405-c0ffee", foreign):
        os.utime(path, (old, old))
    assert main(["runs", "--out", str(out), "--remove-unstarted"]) == 0
    listed = capsys.readouterr().out
    assert "removed" in listed and "c0ffee" in listed
    assert not (out / "20260102T030405-c0ffee").exists()
    assert young.exists() and (foreign / "notes.txt").read_text() == "mine"
    assert load("latest", out).run_id == "20260101T000000-good"


def test_a_reader_gone_from_a_rich_table_is_exit_141(tmp_path):
    """Issue 37: rich ends a broken pipe with exit 1, as if nearlocal had failed."""
    make_run(tmp_path, [row("load", size=64 + k) for k in range(40)], run_id="big")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(  # the reader is gone before the first line is written
        f"{sys.executable} -m nearlocal show big --out {tmp_path} | true; "
        "exit ${PIPESTATUS[0]}", shell=True, executable="/bin/bash", env=env,
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 141, result.stderr
    assert result.stderr == ""


def _caught(pid: int) -> int:
    """The signals process pid has a handler for (/proc/PID/status SigCgt; 0: gone)."""
    try:
        found = re.search(r"^SigCgt:\s*([0-9a-f]+)", Path(f"/proc/{pid}/status").read_text(), re.M)
    except OSError:
        return 0
    return int(found.group(1), 16) if found else 0


@pytest.mark.slow
def test_a_signal_at_any_moment_of_a_runs_start_is_its_exit_code_and_one_line(tmp_path):
    """Issue 56: a Ctrl-C just after a run started gave a traceback about 1 time in 5 (`cannot
    join thread before it is started`, `EOFError: Ran out of input`, a BufferError from the LLC
    probe), was lost (exit 0: swallowed in numba's ctypes callback), or ended the command by
    the signal after its own line (exit -2 under `python -m`). Signals land at 13 moments of the
    first 1.5 s after nearlocal's command line took its signals (the interpreter's own start
    before that is Python's: a signal there is the interpreter's traceback): Ctrl-C to the
    process group, or SIGTERM to the command alone, as `kill` or a CI runner sends it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    problems = []
    for index in range(13):
        delay, signum = index * 0.125, signal.SIGTERM if index % 4 == 3 else signal.SIGINT
        out = tmp_path / f"r{index}"
        shm = _shm(out)
        process = subprocess.Popen(
            [sys.executable, "-m", "nearlocal", "run", "--method", "load", "--size", SIZES,
             "--region", f"shm:{shm.name}", "--budget", "0.2", "--quiet", "--out", str(out),
             "--processes", "1", "--ci", "0.0001"],  # >= 2.4 s of measuring: never done first
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 60
        while not _caught(process.pid) & (1 << (signal.SIGTERM - 1)) and process.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.001)  # until cli.main has its SIGTERM handler
        time.sleep(delay)
        if signum == signal.SIGINT:
            os.killpg(process.pid, signal.SIGINT)
        else:
            process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
        _reap_group(process)
        expected = 130 if signum == signal.SIGINT else 143
        said = f"{signum.name} after {delay:.3f} s: exit {process.returncode}, stderr {err!r}"
        if process.returncode != expected or "Traceback" in err or "Exception ignored" in err \
                or len(err.strip().splitlines()) > 2:
            problems.append(said)
        if shm.exists() or list(Path("/dev/shm").glob(f".{shm.name}.*")):
            problems.append(f"{said}: {shm} left behind")
        for path in out.iterdir() if out.exists() else ():
            if not (path / "run.json").exists() or not load(path.name, out).meta["interrupted"]:
                problems.append(f"{said}: {path.name} is not an interrupted run")
    assert not problems, "\n".join(problems)


def test_a_ctrl_c_that_c_code_swallowed_still_ends_the_command():
    """Issue 56: a Ctrl-C raised inside a callback from C (llvmlite's object cache while numba
    loads a kernel) was printed as `Exception ignored ... KeyboardInterrupt` and lost: the run
    went on and ended with exit 0. Now it is raised again in the command, one line, exit 130."""
    code = ("import ctypes, sys, time\n"
            "from nearlocal.frontends import cli\n"
            "def interrupted():\n"
            "    raise KeyboardInterrupt\n"
            "def command(args):\n"
            "    ctypes.CFUNCTYPE(None)(interrupted)()  # C calls it: the interrupt is swallowed\n"
            "    time.sleep(30)\n"
            "    return 0\n"
            "cli._runs = command\n"
            "sys.exit(cli.main(['runs']))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60,  # Ctrl-C's own disposition: a job started in the
                          # background (`.ci/run &`) inherits SIGINT ignored, and Python keeps it
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 130 and done.stderr == "nearlocal: interrupted\n", done.stderr


def test_a_workers_stop_that_c_code_swallowed_still_stops_it():
    """A worker stopped (SIGTERM) while numba loaded a kernel printed `Exception ignored on
    calling ctypes callback function ... SystemExit: 143` and went on until killed. Now the
    stop is sent again and the worker ends by it, quietly."""
    code = ("import ctypes, os, signal, sys, time\n"
            "from nearlocal.engine import worker\n"
            "from nearlocal.engine.children import resend_swallowed\n"
            "signal.signal(signal.SIGTERM, worker._stopped)\n"
            "sys.unraisablehook = resend_swallowed(sys.unraisablehook, worker._stop_again)\n"
            "def loading():\n"
            "    os.kill(os.getpid(), signal.SIGTERM)  # the parent's stop, raised in here\n"
            "ctypes.CFUNCTYPE(None)(loading)()  # C calls it: the SystemExit is swallowed\n"
            "time.sleep(30)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 143 and done.stderr == "", done.stderr
