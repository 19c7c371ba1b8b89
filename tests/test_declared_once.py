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
