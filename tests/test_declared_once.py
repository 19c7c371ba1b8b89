"""Facts declared once and read by every user: the hardware's identity, a size's spelling, the
ordered-word intrinsics of uint64 flags and uint32 ring indices."""

from __future__ import annotations

import os

import numpy as np
import pytest

from nearlocal.errors import UsageError
from nearlocal.probe import hardware_identity, identity_summary, probe
from nearlocal.sysroot import SysRoot
from nearlocal.units import size_spelled_once
from tests.fakesys import cxl_box


def test_host_id_is_unchanged_and_compare_reads_the_same_identity(tmp_path):
    from nearlocal.gate.identity import _identity, host_differences

    inventory = probe(SysRoot(cxl_box(tmp_path)), calibrate=False, gpu=False)
    assert inventory.host_id == "f456fc347570a4fe"  # as before: baselines are filed under it
    full = {"inventory": inventory.to_dict()}
    bench = {"inventory": identity_summary(inventory)}  # what a bench import stores
    assert _identity(full) == _identity(bench)
    assert hardware_identity(full["inventory"])["cpu"] == inventory.cpu.model
    other = {"inventory": {**bench["inventory"], "host_id": "x"}}
    assert host_differences(full, other) == []


@pytest.mark.parametrize(("given", "spelled"), [
    ("16384", "16KiB"), (16384, "16KiB"), (" 16 KiB ", "16KiB"), ("64x4k", "64x4k"),
    ("rpc:128x64B", "rpc:128x64B"), ("0", "0"), ("4096@2", "4096@2"), ("100", "100B"),
])
def test_one_spelling_of_a_size(given, spelled):
    assert size_spelled_once(given) == spelled


def test_a_number_that_is_no_size_is_an_error():
    with pytest.raises(UsageError):
        size_spelled_once(0)


def test_ordered_words_of_both_widths():
    from numba import njit

    from nearlocal.kernels.intrinsics import fetch_add, load_acquire, store_release

    @njit
    def roundtrip(words, index, value):
        store_release(words, index, value)
        return load_acquire(words, index)

    wide = np.zeros(4, np.uint64)
    assert roundtrip(wide, 2, np.uint64(1 << 40)) == 1 << 40 and wide[2] == 1 << 40
    narrow = np.zeros(4, np.uint32)
    assert roundtrip(narrow, 1, np.uint64((1 << 32) + 7)) == 7  # truncated to the ring's width
    assert list(narrow) == [0, 7, 0, 0]

    @njit
    def add(words):
        return fetch_add(words, 0, np.uint64(3))

    assert add(wide) == 0 and wide[0] == 3


def test_a_method_declares_whether_the_caches_may_serve_it():
    """No default: the plugin example's L1-sized loads were judged against the memory probe."""
    from nearlocal.core.methods import Method

    with pytest.raises(TypeError, match="declare cacheable"):
        Method(name="undeclared", marker="cpu", summary="test double", accesses=("read",),
               state="-", open_session=lambda ctx: None)
    declared = Method(name="declared", marker="cpu", summary="test double", accesses=("read",),
                      state="-", open_session=lambda ctx: None, cacheable=True)
    assert declared.cacheable


def test_a_rack_row_starts_from_its_plan_entrys_row_facts(tmp_path, monkeypatch):
    """The MPI job builds a rack case's rows from rank 0's plan entry (its row facts, described
    with the box's cache sizes, and its decision), with no description of its own: here a rack
    case planned outside an MPI job, skipped, stored with the plan's facts."""
    from types import SimpleNamespace

    from nearlocal.core.cases import Case
    from nearlocal.engine.mpi_job import rack_case as _rack_case
    from nearlocal.engine.plan import RunSettings, Skip, plan_cases
    from nearlocal.store import Store, load

    for name in list(os.environ):  # planned outside MPI: the rack case is skipped
        if name.startswith(("OMPI_", "PMIX_", "PMI_")) or name == "SLURM_NTASKS":
            monkeypatch.delenv(name)
    case = Case("rack-aggregate", "shm:nearlocal-test-never-mapped", "wb", "256KiB", access="read")
    planned = plan_cases([case], probe(calibrate=False, gpu=False), RunSettings(0.02))
    (entry,) = planned.entries
    assert isinstance(entry.decision, Skip)
    store = Store.create(tmp_path, {"suite": "t"})
    hosts = [{"rank": 0, "hostname": "h", "host_id": "i", "kernel_id": "k"}]
    _rack_case(SimpleNamespace(size=1), entry, SimpleNamespace(planned=planned), hosts, {}, store,
               {}, [0])
    (_, row), = load(store.finish(ended="now")).cases.iterrows()
    assert row["status"] == "skipped" and row["reason"] == entry.reason
    for column in ("reaches_memory", "llc_resident", "bytes_moved", "pool_class", "size_bytes"):
        assert row[column] == entry.row[column], column


# --- names that mean one thing (issue 59) ---------------------------------------------------

# Public top-level functions that several modules define. Hooks: one role, defined by each
# module that plays it. Homonyms: different things under one word, each listed so that no new
# one creeps in (rename one side when its module is next touched).
SHARED_FUNCTION_HOOKS = {
    "register": "a command module's hook: adds its subcommand (subcommands.py)",
    "check_params": "a family's Method.check_params: its own parameters checked",
    "contention_cases": "a family's movers=k cases of the contention suite",
    "markdown": "a command's (and the report's) Markdown of its own result",
    "render_junit": "a judging command's JUnit of its own verdicts (accept, compare, faults, replay)",
    "serve": "a server's loop: rdma replay's rank 1, the RPC ring's server, the what-if's",
    "main": "cli.main runs a command line; entry.main is the console script around it",
}
SHARED_FUNCTION_HOMONYMS = {
    "attach": "rack.pools: a job's pools on this host / rpc.shared: a handed-out shared mapping",
    "clock_step": "engine.stability.selfcheck's finding / kernels.timer's step of the TSC",
    "describe_error": "dsa.portal's completion record / rpc.slots' ring error",
    "flags_of": "dsa.uapi's descriptor flags / gpu.regions' allocation flags",
    "int_param": "gpu.session's / rpc.methods' integer parameter reader",
    "measure": "engine.worker: one case in a worker / frontends.measure: a plan into a sink",
    "movers_of": "rdma.device: a case's params / whatif.contention: a stored row",
    "ops_per_sample": "core.methods: a session's / store.schema: a stored row's",
    "prepare": "report.rows: a run's rows / whatif.loadcommand: the load options",
    "run_job": "rack.commands: the run mode's command side / engine.mpi_job: the job it starts",
    "settle": "dsa.kernels.portal's completion wait / storage.kernels' I/O wait",
    "unavailable": "core.cases: why a case cannot run / storage.uring: why io_uring cannot",
    "write_output": "gate.render: a comparison's format / safeio: any file, whole or not at all",
    "write_outputs": "reporters: a command's --FORMAT PATH files / safeio: files written together",
}


def _top_level_names() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Class names and public top-level function names of nearlocal -> the modules defining them."""
    import ast
    from collections import defaultdict
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "nearlocal"
    classes: dict[str, list[str]] = defaultdict(list)
    functions: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                classes[node.name].append(module)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) \
                    and not node.name.startswith("_"):
                functions[node.name].append(module)
    return classes, functions


def test_no_two_classes_in_nearlocal_share_a_name():
    classes, _ = _top_level_names()
    assert {name: where for name, where in classes.items() if len(where) > 1} == {}


def test_no_two_public_functions_share_a_name_unless_listed():
    """judge is no longer two things (gate.verdict.judge_case, acceptance.judge.judge_run)."""
    _, functions = _top_level_names()
    shared = {name for name, where in functions.items() if len(where) > 1}
    listed = SHARED_FUNCTION_HOOKS.keys() | SHARED_FUNCTION_HOMONYMS.keys()
    assert "judge" not in functions
    assert shared - listed == set(), "a new name shared by several modules: rename or list it"
    assert listed - shared == set(), "listed but no longer shared: drop it from the list"
