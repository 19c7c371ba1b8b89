"""The worker start deadline: adaptive (a slow machine is not a failed run), configurable, and a
worker that misses it or dies fails the cases with what it was waiting for."""

from __future__ import annotations

import time

import pytest

from nearlocal.engine import runner as runner_module
from nearlocal.engine import workers
from nearlocal.engine.worker_start import WORKER_START_ENV, own_startup_s, worker_start_deadline
from nearlocal.errors import UsageError


def test_the_deadline_grows_with_this_process_start_up_and_the_last_worker(monkeypatch):
    monkeypatch.delenv(WORKER_START_ENV, raising=False)
    assert worker_start_deadline(None)[0] == 120.0
    assert worker_start_deadline(3.0)[0] == 120.0  # a fast box keeps the floor
    limit, why = worker_start_deadline(50.0)  # a TCG guest's imports
    assert limit == 500.0 and "start-up of 50.0 s" in why
    limit, why = worker_start_deadline(5.0, last_start_s=45.0)
    assert limit == 450.0 and "previous worker" in why


def test_the_environment_fixes_the_deadline_and_a_bad_value_is_bad_input(monkeypatch):
    monkeypatch.setenv(WORKER_START_ENV, "900")
    assert worker_start_deadline(50.0) == (900.0, f"{WORKER_START_ENV}=900")
    for bad in ("soon", "0", "-3", "nan"):
        monkeypatch.setenv(WORKER_START_ENV, bad)
        with pytest.raises(UsageError, match=WORKER_START_ENV):
            worker_start_deadline(None)


def test_own_start_up_is_read_from_proc():
    found = own_startup_s()
    assert found is not None and 0 <= found < time.clock_gettime(time.CLOCK_BOOTTIME)


def never_ready(conn, settings, origin=None) -> None:
    conn.send(("stage", "loading the method modules"))
    time.sleep(60)


def dies_at_once(conn, settings, origin=None) -> None:
    raise SystemExit(3)


def _run(tmp_path, target, monkeypatch):
    from nearlocal.core.cases import Case
    from nearlocal.core.sampling import StoppingRule
    from nearlocal.engine.plan import plan_entries
    from nearlocal.engine.worker import WorkerSettings
    from nearlocal.probe import probe
    from nearlocal.store import Store

    monkeypatch.setattr(workers, "worker_main", target)
    inventory = probe(gpu=False)
    settings = WorkerSettings(StoppingRule(budget_s=0.03, min_samples=5), inventory.tsc_hz, False)
    store = Store.create(tmp_path / "store", {"host_id": inventory.host_id})
    cases = [Case("load", "dram", "wb", size) for size in ("4KiB", "8KiB")]
    started = time.monotonic()
    rows = runner_module.Runner(inventory, settings, store).run(plan_entries(cases, inventory))
    return rows, time.monotonic() - started


class _SilentProcess:
    """A worker process that is alive and never says ready (what a too-slow start looks like)."""

    exitcode = None
    killed = False

    def is_alive(self) -> bool:
        return not self.killed

    def kill(self) -> None:
        self.killed = True

    def join(self, timeout=None) -> None:
        pass


def test_a_late_worker_is_killed_and_the_error_names_the_deadline_and_its_stage(tmp_path, monkeypatch):
    import multiprocessing

    from nearlocal.engine.worker_start import WorkerStartError

    monkeypatch.setenv(WORKER_START_ENV, "0.5")
    worker = workers.MeasuringWorker.__new__(workers.MeasuringWorker)
    worker._startup_s, worker._last_start_s = 1.0, None
    parent, child = multiprocessing.Pipe()
    child.send(("stage", "loading the method modules"))
    process = _SilentProcess()
    with pytest.raises(WorkerStartError) as raised:
        worker._wait_ready(process, parent)
    text = str(raised.value)
    assert text.startswith("the measurement worker did not start within 0.5 s")
    assert f"({WORKER_START_ENV}=0.5)" in text and "loading the method modules" in text
    assert f"set {WORKER_START_ENV}=SECONDS" in text and process.killed


def test_a_worker_dying_at_start_is_reported_at_once(tmp_path, monkeypatch):
    monkeypatch.delenv(WORKER_START_ENV, raising=False)
    rows, took = _run(tmp_path, dies_at_once, monkeypatch)
    assert [row["status"] for row in rows] == ["failed", "failed"]
    assert "died (exit code 3)" in rows[0]["reason"]
    assert rows[1]["reason"] == rows[0]["reason"]  # one start tried, not one per case
    assert took < 100
