"""Facts declared once and read by every user: the hardware's identity, a size's spelling, the
ordered-word intrinsics of uint64 flags and uint32 ring indices."""

from __future__ import annotations

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
        Method(name="undeclared", family="cpu", summary="test double", accesses=("read",),
               state="-", open_session=lambda ctx: None)
    declared = Method(name="declared", family="cpu", summary="test double", accesses=("read",),
                      state="-", open_session=lambda ctx: None, cacheable=True)
    assert declared.cacheable


def test_a_rack_row_says_whether_it_reaches_memory_from_the_boxs_caches():
    """The MPI job takes the plan's row facts (described with the LLC's size), not a second
    description without cache sizes that said `reaches_memory` of every rack row."""
    from types import SimpleNamespace

    from nearlocal.frontends.mpi_job import _planned_row

    case = object()
    entry = SimpleNamespace(case=case, row={"reaches_memory": False, "llc_resident": True})
    plan = SimpleNamespace(planned=SimpleNamespace(entries=[entry]))
    assert _planned_row(plan, case) == {"reaches_memory": False, "llc_resident": True}
    assert _planned_row(SimpleNamespace(planned=None), case) == {}
