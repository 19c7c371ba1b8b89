"""The one-request what-if must not beat the box (issue 57): a row stands for a reload only when
what it read came from memory as well as what it wrote (`source_reaches_memory`: nt-copy's small
rows store to memory but load from the cache), a way that only writes never stands for a gather,
no CPU-moved figure reads faster than the box's best read of its source, and a request may carry
a fixed cost. The fixture run (tests/fixtures/runs/vm-quick-copies) is `nearlocal run --suite
quick --method memcpy,nt-copy,load --attr wb` on the shared 2-vCPU development VM, 2026-12-06:
cases only, its cache-resident rows among them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nearlocal.core.cases import Case
from nearlocal.core.rows import row_facts, source_memory_bytes, source_reaches_memory_column
from nearlocal.errors import UsageError
from nearlocal.frontends.cli import main
from nearlocal.store import load
from nearlocal.whatif import Request, WhatifInputs, inputs_of, whatif
from nearlocal.whatif.fit import fit_run
from nearlocal.whatif.serving import best_way, shape_of

ROOT = Path(__file__).resolve().parent.parent
VM = ROOT / "tests" / "fixtures" / "runs" / "vm-quick-copies"
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


@pytest.fixture(scope="module")
def vm():
    return load(VM)


def _store_with(tmp_path: Path, cases: pd.DataFrame | None = None) -> Path:
    """A store holding the fixture run (its cases replaced by `cases` when given)."""
    root = tmp_path / "results"
    shutil.copytree(VM, root / VM.name)
    if cases is not None:
        cases.to_parquet(root / VM.name / "cases.parquet")
    return root


# --------------------------------------------------------------------------- the row's facts


@pytest.mark.parametrize(("method", "size", "reaches", "source"), [
    ("nt-copy", "16KiB", True, False),  # nontemporal stores, warm loads of the peer
    ("nt-copy", "64MiB", True, True),  # twice the 32 MiB LLC: read from memory
    ("nt-copy", "16MiB", True, False),  # fills the LLC with its peer, not twice it
    ("memcpy", "4MiB", False, False),
    ("memcpy", "64MiB", True, True),
    ("load", "64MiB", True, True),
    ("nt-store", "4KiB", True, True),  # reads nothing: as reaches_memory
    ("nt-load", "4KiB", True, True),  # lines flushed beforehand: memory
])
def test_a_row_says_whether_what_it_read_came_from_memory(method, size, reaches, source):
    row = row_facts(Case(method, "dram", "wb", size), llc_bytes=32 * MIB)
    assert row["reaches_memory"] is reaches
    assert row["source_reaches_memory"] is source


def test_in_a_vm_the_source_must_outgrow_cpuids_llc_too():
    """A busy guest's chase curve read the LLC as 1 MiB while its 16 MiB load ran at 90 GB/s:
    the source counts as memory only past twice the larger of the measured and cpuid's LLC."""
    assert source_memory_bytes(1 * MIB, 32 * MIB) == 64 * MIB
    row = row_facts(Case("load", "dram", "wb", "16MiB"), llc_bytes=1 * MIB,
                    cpuid_llc_bytes=32 * MIB)
    assert row["reaches_memory"] is True and row["source_reaches_memory"] is False


def test_rows_stored_before_the_column_derive_it():
    stored = [None, None, None, None, True]
    reaches = [True, True, False, None, False]
    methods = ["memcpy", "nt-copy", "load", "memcpy", "nt-copy"]
    assert source_reaches_memory_column(stored, reaches, methods) == [True, False, False, None,
                                                                      True]


def test_an_old_run_of_nt_copy_stands_for_no_reload(tmp_path, vm):
    """Without the column, nt-copy's rows cannot say where their loads came from: none stands
    for a hop; memcpy's keep reaches_memory."""
    root = _store_with(tmp_path, vm.cases.drop(columns=["source_reaches_memory"]))
    old = load("latest", root)
    nt = old.cases[old.cases["method"] == "nt-copy"]
    assert not nt["source_reaches_memory"].any()
    ways = [m.way for m in fit_run(old.cases)["host-gather"]]
    assert ways and all(w.startswith("memcpy") for w in ways)


# --------------------------------------------------------------------------- the fixture run


def test_cache_resident_rows_stand_for_no_hop(vm):
    """nt-copy's 16 KiB and 64 KiB rows say reaches_memory (their stores) but their loads never
    left the cache: no model stands on them, nor on any row whose source stayed in a cache."""
    cases = vm.cases.set_index("case_id")
    assert cases.loc["nt-copy/dram/wb/16KiB", "reaches_memory"]
    assert not cases.loc["nt-copy/dram/wb/16KiB", "source_reaches_memory"]
    cached = set(cases.index[~cases["source_reaches_memory"].astype(bool)])
    used = {r for models in fit_run(vm.cases).values() for m in models for r in m.rows}
    assert used and not used & cached


def test_the_gather_is_never_stood_for_by_a_way_that_only_writes(vm):
    """nt-copy only writes (a scatter of the fragments): the request's gather is memcpy's, and
    nt-copy stands only for a contiguous transfer."""
    models = fit_run(vm.cases)["host-gather"]
    by_method = {m.way.split()[0]: m for m in models}
    assert set(by_method) == {"memcpy", "nt-copy"}
    assert by_method["memcpy"].gathers and not by_method["nt-copy"].gathers
    for model, context in (("llama-3.1-8b", 4096), ("qwen2.5-32b", 16384),
                           ("llama-3.1-70b", 32768)):
        result = whatif(inputs_of(vm), Request(model=model, context=context))
        (term, *_) = next(p for p in result.paths if p.path == "cpu-offload").terms
        assert term.hop == "host-gather" and term.way.startswith("memcpy"), term
        assert any("blocks=scattered/read" in r for r in term.rows)
    contiguous = best_way(models, 1, 512 * MIB)
    assert contiguous is not None  # either way may move one contiguous piece
    only_writes = [by_method["nt-copy"]]
    assert best_way(only_writes, 16384, 32 * KIB, gather=True) is None


def test_a_hop_measured_only_by_a_scatter_stands_for_no_gather(vm):
    cases = vm.cases[vm.cases["method"] != "memcpy"]
    inputs = inputs_of(vm.__class__(vm.path, vm.meta, cases, vm.samples, vm.incomplete))
    assert [m.way for m in inputs.measured["host-gather"]] == ["nt-copy dram -> dram"]
    result = whatif(inputs, Request(model="llama-3.1-8b", context=4096))
    offload = next(p for p in result.paths if p.path == "cpu-offload")
    assert not offload.complete and all(t.way != "nt-copy dram -> dram" for t in offload.terms)


@settings(max_examples=40, deadline=None)
@given(fragments=st.integers(1, 1 << 20), size=st.integers(64, 256 * MIB))
def test_no_prediction_reads_faster_than_the_box(fragments, size):
    """Every CPU-moved way of the run is bounded by the run's best read of dram from memory
    (load, 64 MiB, one thread), whatever the read's shape; where that bound binds, a note names
    its row."""
    models = fit_run(load(VM).cases)["host-gather"]
    for model in models:
        ceiling = model.ceiling
        assert ceiling is not None and ceiling.case_id == "load/dram/wb/64MiB"
        got = model.predict(fragments, size)
        assert fragments * size / got.ns <= ceiling.bytes_per_ns * (1 + 1e-9)
        if any("taken at that ceiling" in n for n in got.notes):
            assert ceiling.case_id in got.rows


def test_a_ceiling_below_the_fit_binds_and_is_named(vm):
    cases = vm.cases.copy()
    ceiling = cases["case_id"] == "load/dram/wb/64MiB"
    cases.loc[ceiling, "median_ns"] = 64 * MIB / 2.0  # 2 GB/s: below every way's fit
    models = fit_run(cases)["host-gather"]
    for model in models:
        got = model.predict(16384, 32 * KIB)
        assert 16384 * 32 * KIB / got.ns == pytest.approx(2.0)
        note = next(n for n in got.notes if "taken at that ceiling" in n)
        assert "load with 1 thread (2.0 GB/s, row load/dram/wb/64MiB)" in note


def test_a_run_without_a_read_of_memory_says_it_has_no_ceiling(vm):
    cases = vm.cases[vm.cases["method"] != "load"]
    for model in fit_run(cases)["host-gather"]:
        assert model.ceiling is None
        assert any("has no read of dram from memory with 1 thread or more" in n
                   for n in model.predict(16384, 32 * KIB).notes)


def test_a_ceiling_needs_as_many_threads_as_the_way(vm):
    """A two-thread copy is not bounded by a one-thread read: no ceiling, said."""
    cases = vm.cases.copy()
    copies = cases["method"].isin(["memcpy", "nt-copy"])
    cases.loc[copies, "effective_params"] = [
        json.dumps({**json.loads(p), "threads": "2"}) for p in cases.loc[copies, "effective_params"]]
    for model in fit_run(cases)["host-gather"]:
        assert model.ceiling is None
        assert any("with 2 threads or more" in n for n in model.notes)


# --------------------------------------------------------------------------- fixed cost


def test_a_fixed_cost_per_request_adds_to_the_reload_once_per_request(vm):
    inputs = inputs_of(vm)
    request = Request(model="llama-3.1-8b", context=4096, layer_compute_us=100,
                      prefill_tokens_per_s=10_000)
    base = next(p for p in whatif(inputs, request).paths if p.path == "cpu-offload")
    assert base.reload_ns is None  # no host->gpu hop on a CPU box
    reference = WhatifInputs({**inputs.measured}, inputs.run)
    from nearlocal.whatif import load_reference

    box = load_reference("beluga-h20")
    for batch in (1, 3):
        plain = whatif(reference, Request(**{**request.__dict__, "batch": batch}), box)
        fixed = whatif(reference, Request(**{**request.__dict__, "batch": batch,
                                             "fixed_ms": 111.0}), box)
        before = next(p for p in plain.paths if p.path == "cpu-offload")
        after = next(p for p in fixed.paths if p.path == "cpu-offload")
        assert after.reload_ns == pytest.approx(before.reload_ns + batch * 111e6)
        assert after.fixed_ns == pytest.approx(batch * 111e6)
        assert after.pipelined_ns == pytest.approx(before.pipelined_ns + batch * 111e6)
        assert after.requests_per_s == pytest.approx(batch * 1e9 / after.reload_ns)
        assert any("111 ms fixed per request" in n for n in after.notes)


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_bad_fixed_cost_is_one_line(tmp_path, capsys, value):
    root = _store_with(tmp_path)
    assert main(["whatif", "--out", str(root), f"--fixed-ms={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--fixed-ms" in err and len(err.splitlines()) == 1 and "Traceback" not in err
    with pytest.raises(UsageError, match="--fixed-ms"):
        shape_of(Request(fixed_ms=float(value)))


def test_the_fixed_cost_on_the_command_line(tmp_path, capsys):
    root = _store_with(tmp_path)
    assert main(["whatif", "--out", str(root), "--reference", "beluga-h20", "--fixed-ms", "111",
                 "--model", "llama-3.1-8b", "--context", "4k", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["request"]["fixed_ms"] == 111.0
    offload = next(p for p in data["paths"] if p["path"] == "cpu-offload")
    assert offload["fixed_ns"] == pytest.approx(111e6)
    assert offload["reload_ns"] > 111e6
