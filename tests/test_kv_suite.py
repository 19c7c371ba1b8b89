"""`nearlocal kv` and the `kv` suite: exit codes, the numbers printed, rows in the store."""

from __future__ import annotations

import json
import os

import pytest

from nearlocal.core.methods import get_method, load_methods
from nearlocal.core.patterns import parse_pattern
from nearlocal.core.suites import suite_cases
from nearlocal.frontends.cli import main
from nearlocal.store import load


def _kv_json(capsys, *argv: str) -> dict:
    assert main(["kv", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_kv_command_reports_fragments(capsys):
    data = _kv_json(capsys, "--model", "qwen2.5-32b", "--tp", "1", "--block-tokens", "16",
                    "--layout", "flash-attn", "--select", "dense")
    assert data["fragment_count"] == 128 and data["fragment_bytes_median"] == 32 * 1024
    assert data["rdma_work_requests"] == 5 and data["total_bytes"] == 4 * 1024**2
    assert data["histogram"] == [{"size": "32KiB", "fragments": 128, "bytes": 4 * 1024**2}]
    assert data["pattern"] == "kv:qwen2.5-32b:flash-attn:dense:bt=16"
    data = _kv_json(capsys, "--layout", "flashinfer")
    assert (data["fragment_count"], data["fragment_bytes_median"]) == (64, 64 * 1024)
    data = _kv_json(capsys, "--select", "superblock")
    assert data["fragment_count"] == 128 and data["fragment_bytes_median"] == 512 * 1024
    data = _kv_json(capsys, "--select", "sparse:256", "--layers", "0-1", "--ctx", "1024")
    assert data["fragment_count"] == 2 * 2 * 8 * 256 and data["non_contiguous"] == 1.0
    data = _kv_json(capsys, "--select", "1024x160B")
    assert data["fragment_count"] == 1024 and data["rdma_work_requests"] == 35
    assert main(["kv"]) == 0
    assert "128 fragments" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "words"), [
    (["--model", "qwen9-1t"], "unknown model"),
    (["--tp", "3"], "does not divide"),
    (["--tp", "0"], "positive"),
    (["--block-tokens", "8"], "not allowed by the flash-attn layout"),
    (["--layout", "lmcache", "--block-tokens", "100"], "not allowed by the lmcache layout"),
    (["--layout", "paged"], "unknown layout"),
    (["--select", "everything"], "unexpected"),
    (["--select", "sparse:256", "--dist", "bimodal"], "distribution"),
    (["--select", "dense:99999999999"], "beyond"),
    (["--select", "sparse:256", "--ctx", "99999999999"], "ctx="),
    (["--select", "sparse:256", "--ctx", "-5"], "whole number"),
    (["--pool", "99999999999999"], "TiB"),
    (["--select", "99999999999x99999999999B"], "beyond"),
    (["--dtype", "fp8_ds_mla"], "fp8_ds_mla"),
])
def test_kv_command_bad_input_exits_2(capsys, argv, words):
    assert main(["kv", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_kv_command_model_config_with_1e12_layers_exits_2(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text('{"num_hidden_layers": 1e12, "num_attention_heads": 8, "head_dim": 128}')
    assert main(["kv", "--model", str(config)]) == 2
    err = capsys.readouterr().err
    assert "num_hidden_layers" in err and err.count("\n") == 1


def test_kv_command_names_are_case_insensitive_and_says_which_side(capsys):
    data = _kv_json(capsys, "--layout", "FlashInfer", "--select", "Dense:4", "--pool", "4",
                    "--order", "HND")
    assert data["fragment_count"] == 64 and data["kv_tensors"] == 64
    assert data["layout_side"] == "region" and "per-layer tensors" in data["sides"]
    data = _kv_json(capsys, "--model", "deepseek-v3.2", "--layout", "mla", "--dtype", "fp8_ds_mla")
    assert data["token_bytes"] == 656 and data["kv_dtype"] == "fp8_ds_mla"


def test_kv_command_says_the_papers_shapes_do_not_follow(capsys):
    data = _kv_json(capsys, "--select", "1024x160B")
    assert "B14" in data["paper_note"] and "256 B" in data["paper_note"]
    data = _kv_json(capsys, "--select", "128x20KiB")
    assert "B2" in data["paper_note"] and "32KiB" in data["paper_note"]
    assert _kv_json(capsys, "--select", "64x4KiB")["paper_note"] is None
    assert main(["kv", "--select", "1024x160B"]) == 0
    assert "does not follow" in " ".join(capsys.readouterr().out.split())  # rich wraps lines


def test_run_pattern_bounds_exit_2_before_measuring(tmp_path, capsys):
    for pattern in ("99999999999x99999999999B", "kv:qwen2.5-32b:flash-attn:dense:99999999999"):
        rc = main(["run", "--method", "load", "--region", "dram", "--pattern", pattern,
                   "--out", str(tmp_path), "--quiet"])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert not any(tmp_path.iterdir())  # nothing stored


def test_kv_patterns_parse_through_the_core_parser():
    load_methods()  # the kv: kind is registered by a method module, as in worker processes
    pattern = parse_pattern("kv:qwen2.5-32b:flash-attn:dense")
    assert pattern.count == 128
    assert {"model", "layout", "select", "contiguity", "rdma_work_requests"} <= set(pattern.axes)
    scatter = pattern.swapped()
    assert (scatter.frags[:, 1] == pattern.frags[:, 0]).all()


def test_kv_suite_has_metadata_gather_and_scatter_rows():
    cases = suite_cases("kv")
    methods = {(c.method, c.access) for c in cases}
    assert {("kv-metadata", "read"), ("load", "read"), ("clflushopt-load", "read"),
            ("memcpy", "read"), ("nt-store", "write"), ("memcpy", "write")} <= methods
    assert {c.region for c in cases if c.method == "load"} == {"dram", "shm:nearlocal-kv"}
    for case in cases:  # GPU rows appear only for declared methods; all are valid names
        get_method(case.method)
    assert all(not c.pattern.startswith("kv:1024x") for c in cases if c.method == "kv-metadata")


def test_kv_run_stores_rows_with_fragment_columns(tmp_path, capsys):
    shm = f"shm:nearlocal-kv-test-{os.getpid()}"
    pattern = "kv:qwen2.5-32b:flash-attn:dense:tp=8"
    rc = main(["run", "--suite", "kv", "--method", "kv-metadata", "--method", "nt-store",
               "--method", "load", "--region", "dram", "--region", shm, "--pattern", pattern,
               "--budget", "0.01", "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    run = load(next(p for p in tmp_path.iterdir() if p.is_dir()))
    rows = run.cases
    assert len(rows) == 6 and (rows["status"] == "ok").all(), rows[["case_id", "reason"]]
    assert (rows["fragment_count"] == 128).all() and (rows["fragment_bytes"] == 4096).all()
    assert set(rows["layout"]) == {"flash-attn"} and set(rows["model"]) == {"qwen2.5-32b"}
    assert (rows["rdma_work_requests"] == 5).all()
    assert set(rows["access"]) == {"read", "write"}
    meta = rows[rows["method"] == "kv-metadata"]
    assert len(meta) == 2 and (meta["median_ns"] > 0).all()
    assert len(run.samples) >= 6
    assert not os.path.exists(f"/dev/shm/{shm.split(':')[1]}")


def test_gpu_rows_appear_only_for_declared_gpu_methods(monkeypatch):
    from nearlocal.core import methods as registry
    from nearlocal.core.methods import Method
    from nearlocal.regions import REGION_KINDS, load_providers
    from nearlocal.workloads import kv_methods

    load_methods()
    load_providers()
    if not {"gpu", "pinned", "registered"} <= set(REGION_KINDS):
        pytest.skip("GPU region kinds are not declared in this tree")
    for name in (*kv_methods.GPU_GATHER, *kv_methods.GPU_SCATTER):
        monkeypatch.delitem(registry.METHODS, name, raising=False)
    pattern = "kv:qwen2.5-32b:flash-attn:dense"
    assert kv_methods._gpu_cases(pattern) == []

    def never(ctx):  # a test double: never opened, never registered outside this test
        raise AssertionError("not run")

    double = Method("gather-kernel", "gpu", "test double", ("read",), "-", never,
                    region_spaces=frozenset({"host"}), peer_spaces=frozenset({"gpu"}),
                    cacheable=False)
    monkeypatch.setitem(registry.METHODS, "gather-kernel", double)
    cases = kv_methods._gpu_cases(pattern)
    assert {(c.method, c.region, c.peer, c.access) for c in cases} == {
        ("gather-kernel", "pinned", "gpu:0", "read"),
        ("gather-kernel", "registered:dram", "gpu:0", "read")}
