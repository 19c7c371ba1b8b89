"""The runner's sink is declared (engine/sink.py RunSink): the store, the MPI job's rank store and
the bench collector each have every member it declares, with the same parameters, so the runner
calls them without probing for methods."""

from __future__ import annotations

import inspect
import json

import pytest

from nearlocal.bench.benchmarks import _Collected
from nearlocal.engine.mpi_job import RankStore as _RankStore
from nearlocal.engine.sink import RunSink
from nearlocal.store.writer import Store

SINKS = {"store": Store, "rank store": _RankStore, "bench collector": _Collected}
MEMBERS = [name for name, value in vars(RunSink).items()
           if callable(value) and not name.startswith("_")]


def test_the_protocol_declares_what_the_runner_calls():
    assert sorted(MEMBERS) == ["add_busy", "add_case", "add_host_failure", "add_host_reading"]
    assert "keeps_busy" in RunSink.__annotations__


@pytest.mark.parametrize("sink", SINKS.values(), ids=SINKS.keys())
@pytest.mark.parametrize("member", MEMBERS)
def test_every_sink_has_the_members_with_the_protocols_parameters(sink, member):
    declared = inspect.signature(getattr(RunSink, member)).parameters
    have = inspect.signature(getattr(sink, member)).parameters
    assert list(have) == list(declared)
    assert [p.default for p in have.values()] == [p.default for p in declared.values()]


def test_each_sink_is_one_at_run_time(tmp_path):
    store = Store.create(tmp_path, {})
    for sink in (store, _RankStore(None, [], store), _RankStore(None, []), _Collected()):
        assert isinstance(sink, RunSink)
    assert store.keeps_busy and _RankStore(None, [], store).keeps_busy
    assert not _RankStore(None, []).keeps_busy and not _Collected().keeps_busy  # dropped there


def test_mark_incomplete_is_on_disk_before_finish(tmp_path):
    """The MPI job's reason for an incomplete run is written at once (a SIGKILL may follow)."""
    store = Store.create(tmp_path, {"suite": "quick"})
    store.mark_incomplete("ranks lost: rank 1", lost_ranks=[1])
    meta = json.loads((store.path / "run.json").read_text())
    assert meta["incomplete_reason"] == "ranks lost: rank 1" and meta["lost_ranks"] == [1]
    assert meta["complete"] is False
    store.finish(interrupted=True)
    meta = json.loads((store.path / "run.json").read_text())
    assert meta["incomplete_reason"] == "ranks lost: rank 1" and meta["interrupted"]
