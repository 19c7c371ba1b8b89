"""Facts declared once and read by every user: the hardware's identity, a size's spelling, the
ordered-word intrinsics of uint64 flags and uint32 ring indices."""

from __future__ import annotations

import numpy as np
import pytest

from nearlocal.errors import UsageError
from nearlocal.hwprobe import hardware_identity, identity_summary, probe
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
