"""The run's self-check: what physics rules out is caught from the run itself, one line in the
run's output and a note at the top of the report."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from nearlocal.engine.stability.selfcheck import self_check, summary_line

TSC_HZ = 2.5e9
META = {"clock": {"overhead_ticks": 50.0, "quantum_ticks": 2.0, "tsc_hz": TSC_HZ,
                  "step_ns": 0.8}}


def _row(case_id, method="load", size=16384, median_ns=100.0, gbps=10.0, steps=300.0,
         processes=2, info=None):
    return {"case_id": case_id, "status": "ok", "clock": "tsc", "method": method, "attr": "wb",
            "size_bytes": size, "median_ns": median_ns, "gbps": gbps, "sample_steps": steps,
            "processes": processes, "info": json.dumps(info or {})}


def _samples(case_id, scales=(2.5, 2.5)):
    """Per process, ns = (raw - overhead) / scale."""
    rows = []
    for process, scale in enumerate(scales):
        raw = np.arange(200.0, 260.0)
        rows.append(pd.DataFrame({"case_id": case_id, "raw": raw, "ns": (raw - 50.0) / scale,
                                  "process": process}))
    return pd.concat(rows, ignore_index=True)


def test_a_sane_run_passes_every_check():
    cases = pd.DataFrame([_row("load/16KiB"), _row("chase/16KiB", "chase", median_ns=1.6)])
    samples = pd.concat([_samples("load/16KiB"), _samples("chase/16KiB")])
    result = self_check(META, cases, samples)
    assert result["suspect"] == [] and set(result["checks"]) == {"clock", "l1-chase",
                                                                 "bandwidth", "processes", "busy"}
    assert result["settings"] == []
    assert summary_line(result).startswith("self-check: ok")


def test_each_impossible_figure_is_named():
    cases = pd.DataFrame([
        _row("load/64B", size=64, steps=0.4),  # under one step of the clock
        _row("chase/16KiB", "chase", median_ns=80.0),  # 200 ticks for an L1 hit
        _row("load/1GiB", size=1 << 30, gbps=5000.0),  # 5 TB/s from one thread
        _row("store/4KiB"),
    ])
    samples = pd.concat([_samples("load/64B"), _samples("store/4KiB", (2.5, 5.0))])
    result = self_check(META, cases, samples)
    checks = result["checks"]
    assert not any(check["ok"] for name, check in checks.items() if name != "busy")
    line = summary_line(result)
    assert line.startswith("self-check: these figures are suspect:")
    for name in ("load/64B", "chase", "load/1GiB", "store/4KiB"):
        assert name in line


def test_the_report_leads_with_a_suspect_run(tmp_path):
    from nearlocal.frontends.cli import main
    from nearlocal.store import load
    from nearlocal.store.writer import Store

    out = tmp_path / "store"
    assert main(["run", "--method", "load", "--size", "4KiB", "--budget", "0.02",
                 "--processes", "2", "--out", str(out), "--quiet"]) == 0
    run = load(next(out.iterdir()))
    # physics passes; whether the box was busy is the box's (another test may share the CPUs)
    assert all(check["ok"] for name, check in run.meta["self_check"]["checks"].items()
               if name != "busy")
    meta = {**run.meta, "run_id": None, "self_check": {"checks": {}, "suspect": ["made up"]}}
    store = Store.create(tmp_path / "other", meta)
    for _, row in run.cases.iterrows():
        store.add_case(row.to_dict())
    path = store.finish()
    assert main(["report", str(path), "--markdown", str(tmp_path / "r.md")]) == 0
    text = (tmp_path / "r.md").read_text()
    assert "These figures are suspect: made up" in text


def test_show_says_the_stored_self_check_as_run_did(tmp_path, capsys):
    """Issue 56: `show` printed no self-check; now the run's stored one, as `run` printed it
    (stdout, after the table); --json stays the rows alone; a damaged one is no traceback."""
    from nearlocal.frontends.cli import main
    from tests.report_fixtures import make_run, row

    check = {"checks": {"physics": {"ok": True}}, "suspect": ["CPU 1 was 99 % busy"],
             "settings": ["governor powersave on CPU 0-1: ..."]}
    make_run(tmp_path, [row("load")], run_id="judged", meta={"self_check": check})
    make_run(tmp_path, [row("load")], run_id="damaged", meta={"self_check": {"suspect": 5}})
    make_run(tmp_path, [row("load")], run_id="before")  # stored before runs checked themselves
    assert main(["show", "judged", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.endswith(summary_line(check) + "\n")
    assert "self-check: these figures are suspect: CPU 1 was 99 % busy" in out
    assert main(["show", "judged", "--out", str(tmp_path), "--json"]) == 0
    assert isinstance(json.loads(capsys.readouterr().out), list)
    assert main(["show", "damaged", "--out", str(tmp_path)]) == 0
    assert "self-check: these figures are suspect: 5" in capsys.readouterr().out
    assert main(["show", "before", "--out", str(tmp_path)]) == 0
    assert "self-check" not in capsys.readouterr().out
