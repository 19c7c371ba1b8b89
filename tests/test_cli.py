"""The command line end to end: bad input gets one line and exit 2, runs land in the store,
a crashing case is recorded as failed and the run completes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nearlocal.frontends.cli import main
from nearlocal.store import load
from nearlocal.store.schema import SCHEMA_VERSION

TINY = ["--budget", "0.02", "--quiet"]


@pytest.mark.parametrize("argv, fragment", [
    (["run", "--method", "teleport"], "unknown method 'teleport'"),
    (["run", "--region", "moon"], "unknown region 'moon'"),
    (["run", "--suite", "nope"], "unknown suite 'nope'"),
    (["run", "--method", "load", "--size", "12XB"], "malformed size '12XB'"),
    (["run", "--method", "load", "--size", "-4"], "malformed size '-4'"),
    (["run", "--method", "load", "--size", "0"], "size"),
    (["run", "--method", "load", "--attr", "xx"], "unknown attribute 'xx'"),
    (["run", "--method", "load", "--region", "devdax:/dev/null"], "not a device-dax"),
    (["run", "--method", "load", "--region", "devdax:/dev/dax9.9"], "does not exist"),
    (["run", "--method", "load", "--region", "numa:99"], "NUMA node 99 does not exist"),
    (["run", "--method", "load", "--budget", "fast"], "malformed duration"),
    (["run", "--frobnicate"], "unrecognized arguments"),
    (["run", "--method", "load", "--param", "qd=3"], "method load has no parameter qd"),
    (["run", "--method", "load", "--param", "qd"], "malformed --param 'qd'"),
    (["run", "--method", "load", "--ci", "0"], "--ci must be a percentage"),
    (["show", "no-such-run"], "no run 'no-such-run'"),
])
def test_bad_input_is_one_line_and_exit_2(argv, fragment, capsys, tmp_path):
    code = main([*argv, "--out", str(tmp_path)] if argv[0] in ("run", "show") else argv)
    err = capsys.readouterr().err
    assert code == 2
    assert fragment in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_unwritable_results_directory(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = main(["run", "--method", "load", "--size", "64", "--out", str(blocker / "x"), *TINY])
    assert code == 2
    assert "not writable" in capsys.readouterr().err


def test_only_writes_to_a_user_file_need_allow_write(capsys, tmp_path):
    existing = tmp_path / "pool.bin"
    existing.write_bytes(b"\1" * 8192)
    code = main(["run", "--method", "nt-store", "--region", f"file:{existing}", "--size", "4KiB",
                 "--out", str(tmp_path / "r"), *TINY])
    assert code == 2
    assert "--allow-write" in capsys.readouterr().err
    assert existing.read_bytes() == b"\1" * 8192  # untouched


def test_reads_of_a_user_file_run_without_allow_write_and_never_write(tmp_path):
    existing = tmp_path / "pool.bin"
    existing.write_bytes(b"\3" * 8192)
    code = main(["run", "--method", "load", "--method", "nt-store", "--region", f"file:{existing}",
                 "--size", "4KiB", "--out", str(tmp_path / "r"), *TINY])
    assert code == 0
    cases = load(None, tmp_path / "r").cases.set_index("method")
    assert cases.loc["load", "status"] == "ok"
    assert cases.loc["nt-store", "status"] == "skipped"
    assert "--allow-write" in cases.loc["nt-store", "reason"]
    assert existing.read_bytes() == b"\3" * 8192


def test_run_lands_in_the_store_with_json(tmp_path, monkeypatch):
    """The rows `run` prints and writes with --json are the runner's own, which are the rows
    stored: the run is not read back from the store to show them."""
    import nearlocal.store
    import nearlocal.store.reader
    from nearlocal.frontends.selection import json_records
    from nearlocal.store.schema import JSON_COLUMNS

    out, json_path = tmp_path / "store", tmp_path / "rows.json"
    loads = []
    for module in (nearlocal.store, nearlocal.store.reader):
        monkeypatch.setattr(module, "load", lambda *a, **k: loads.append(a) or load(*a, **k))
    code = main(["run", "--method", "load", "--method", "movdir64b", "--attr", "wb",
                 "--attr", "uc", "--size", "64,16KiB", "--out", str(out), "--json",
                 str(json_path), *TINY])
    assert code == 0 and not loads
    run = load(None, out)
    assert json.loads(json_path.read_text()) == json.loads(json_records(run.cases, JSON_COLUMNS))
    assert run.meta["complete"] and run.meta["schema_version"] == SCHEMA_VERSION
    assert run.meta["inventory"]["cpu"]["model"]
    cases = run.cases.set_index("case_id")
    assert len(cases) == 8
    ok = cases.loc["load/dram/wb/16KiB"]
    assert ok.status == "ok" and ok.size_bytes == 16384 and ok.n_samples > 0
    assert ok.min_ns <= ok.median_ns <= ok.p99_ns
    assert abs(ok.gbps - 16384 / ok.median_ns) < 1e-9
    assert len(run.samples_of("load/dram/wb/16KiB")) == ok.n_samples
    assert cases.loc["load/dram/uc/16KiB", "status"] == "skipped"
    assert "uncacheable" in cases.loc["load/dram/uc/16KiB", "reason"]
    rows = json.loads(json_path.read_text())
    assert {"method", "region", "attr", "size_bytes", "status", "reason", "median_ns", "p99_ns",
            "gbps", "n_samples", "converged"} <= set(rows[0])
    assert len(rows) == 8


def test_a_crashing_case_is_recorded_and_the_run_completes(tmp_path):
    env = {**os.environ, "NEARLOCAL_PLUGINS": "tests.crash_plugin"}
    out = tmp_path / "store"
    proc = subprocess.run(
        [sys.executable, "-m", "nearlocal.frontends.cli", "run", "--method", "load", "--method",
         "crash-segv", "--method", "store", "--size", "4KiB", "--out", str(out), *TINY],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    cases = load(None, out).cases.set_index("method")
    assert cases.loc["crash-segv", "status"] == "failed"
    assert "SIGSEGV" in cases.loc["crash-segv", "reason"]
    assert cases.loc["load", "status"] == "ok" and cases.loc["store", "status"] == "ok"


def test_probe_json_lists_every_method_with_a_verdict(capsys):
    assert main(["probe", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {(r["method"], r["region"], r["attr"]): r for r in data["availability"]}
    assert rows[("load", "dram", "wb")]["runnable"]
    assert not rows[("load", "dram", "uc")]["runnable"]
    assert data["inventory"]["host_id"]
