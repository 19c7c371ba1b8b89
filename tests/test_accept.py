"""`nearlocal accept`: specs judged against synthetic runs, malformed specs, one real measurement."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from nearlocal.acceptance.spec import parse_spec
from nearlocal.core.cases import Case
from nearlocal.core.rows import row_facts
from nearlocal.core.sampling import summarize
from nearlocal.frontends.cli import main
from nearlocal.store import Store, load

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "acceptance"
MEDIANS = {  # ns
    "load/dram/wb/16KiB": 100.0,
    "clflushopt-load/dram/wb/16KiB": 2000.0,
    "clflush-load/dram/wb/16KiB": 2100.0,
    "nt-load/dram/wb/16KiB": 1500.0,
    "nt-store/dram/wb/64MiB": 3e6,
    "store/dram/wb/64MiB": 5e6,
    "load/dram/wb/64KiB": 600.0,
}

TWO_REQUIREMENTS = """
[[requirement]]
name = "warm 16 KiB load within 3us"
case = { method = "load", size = "16KiB" }
max = "3us"
[[requirement]]
name = "warm 16 KiB load under 50 ns"
case = { method = "load", size = "16KiB" }
max = 50
"""


@pytest.fixture
def run(tmp_path) -> str:
    store = Store.create(tmp_path, {"suite": "test", "host_id": "h"})
    for case_id, median in MEDIANS.items():
        method, region, attr, pattern = case_id.split("/")
        row = row_facts(Case(method, region, attr, pattern))
        ns = np.full(50, median)
        row.update(status="ok", reason="", converged=True, **summarize(ns, row["bytes_moved"]))
        store.add_case(row, ns, ns)
    store.add_case({**row_facts(Case("load", "numa:1", "wb", "64KiB")), "status": "skipped",
                    "reason": "NUMA node 1 does not exist"})
    return store.finish().name


def _spec(tmp_path: Path, text: str) -> str:
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return str(path)


def _accept(tmp_path: Path, spec: str, run: str, *extra: str) -> int:
    return main(["accept", spec, run, "--out", str(tmp_path), *extra])


def test_local_dram_example_passes_a_sane_run(tmp_path, run, capsys):
    junit = tmp_path / "accept.xml"
    assert _accept(tmp_path, str(EXAMPLES / "local-dram.toml"), run, "--junit", str(junit)) == 0
    out = capsys.readouterr().out
    assert "4 passed, 0 failed" in out
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "4" and suite.get("failures") == "0"


def test_absolute_and_ratio_bounds(tmp_path, run, capsys):
    spec = _spec(tmp_path, """
[defaults]
region = "dram"
""" + TWO_REQUIREMENTS + """
[[requirement]]
name = "64 MiB nt-store at 30 GB/s"
case = { method = "nt-store", size = "64MiB" }
min_gbps = 30
[[requirement]]
name = "clflushopt-load at most 10x a warm load"
case = { method = "clflushopt-load", size = "16KiB" }
max_ratio_to = { method = "load", ratio = 10 }
""")
    junit = tmp_path / "accept.xml"
    assert _accept(tmp_path, spec, run, "--junit", str(junit), "--json", str(tmp_path / "v.json")) == 1
    assert "1 passed, 3 failed" in capsys.readouterr().out
    failures = {c.get("name"): c.find("failure") for c in ET.parse(junit).getroot().iter("testcase")}
    assert failures["warm 16 KiB load within 3us"] is None
    assert "margin -100.0%" in failures["warm 16 KiB load under 50 ns"].get("message")
    assert "22.37 GB/s" in failures["64 MiB nt-store at 30 GB/s"].get("message")
    assert "20.000x" in failures["clflushopt-load at most 10x a warm load"].get("message")


def test_requirement_whose_case_did_not_run_fails_with_the_reason(tmp_path, run, capsys):
    spec = _spec(tmp_path, """
[[requirement]]
name = "pool read near-local"
case = { method = "load", region = "numa:1", size = "64KiB" }
max_ratio_to = { region = "dram", ratio = 1.25 }
[[requirement]]
name = "never measured"
case = { method = "store", size = "1KiB" }
max = "1us"
""")
    junit = tmp_path / "accept.xml"
    assert _accept(tmp_path, spec, run, "--junit", str(junit)) == 1
    messages = [c.find("failure").get("message") for c in ET.parse(junit).getroot().iter("testcase")]
    assert messages[0] == "not measured: load/numa:1/wb/64KiB: NUMA node 1 does not exist"
    assert messages[1] == "not measured: store/dram/wb/1KiB is not in the run"
    assert "0 passed, 2 failed" in capsys.readouterr().out


@pytest.mark.parametrize(("text", "line", "problem"), [
    ('[[requirement]]\ncase = { method = "load" }\nmetric = "p95_ns"\nmax = "1us"\n', 3,
     "unknown metric 'p95_ns'"),
    ('[[requirement]]\ncase = { method = "load" }\nmax = "1us"\n\n[[requirement]]\nname = "x"\n'
     'case = { method = "lode" }\nmax = "1us"\n', 7, "unknown method 'lode'"),
    ('[[requirement]]\ncase = { method = "load" }\nmax = "1us"\nmin = "1ns"\n', 4,
     "exactly one bound"),
    ('[[requirement]]\ncase = { method = "load" }\nmax = "fast"\n', 3, "malformed duration"),
    ('[[requirement]]\ncase = { method = "load" }\nmax_ratio_to = { ratio = 2 }\n', 3,
     "names the case itself"),
    ('[[requirement]]\ncase = { method = "load", size = "16QB" }\nmax = "1us"\n', 2,
     "malformed size or pattern"),
    ('[[requirement]]\ncase = { method = "load" }\nmaximum = "1us"\n', 3, "unknown key 'maximum'"),
    ('[[requirement]]\ncase = { method = "load" }\nmax = 0\n', 3, "must be a positive duration"),
    ('[[requirement]]\ncase = { method = "load" }\n\nmin = -2.5\n', 4,
     "must be a positive duration"),
    ('requirement = [1]\n', 1, "must be a table"),
    ('[run]\nbudget = "1s"\nci = 0\n[[requirement]]\ncase = { method = "load" }\nmax = 1\n', 3,
     "ci must be a percentage"),
    ('title = "t"\ndefaults = 3\n[[requirement]]\ncase = { method = "load" }\nmax = 1\n', 2,
     "[defaults] takes case fields only"),
    ('[run]\nbudget = "1s"\nthreads = 4\n[[requirement]]\ncase = { method = "load" }\nmax = 1\n', 3,
     "not 'threads'"),
    ('[run]\nbudget = "1s"\nplacements = 0\n[[requirement]]\ncase = { method = "load" }\nmax = 1\n',
     3, "[run]: placements must be an integer from 1 to 16, got 0"),
    ('[run]\nplacements = "2"\n[[requirement]]\ncase = { method = "load" }\nmax = 1\n', 2,
     "placements must be an integer"),
])
def test_malformed_spec_exits_2_with_the_line(tmp_path, run, capsys, text, line, problem):
    spec = _spec(tmp_path, text)
    assert _accept(tmp_path, spec, run) == 2
    err = capsys.readouterr().err
    assert f"spec.toml:{line}:" in err and problem in err


def test_invalid_toml_exits_2(tmp_path, run, capsys):
    assert _accept(tmp_path, _spec(tmp_path, "[[requirement]\ncase = 1\n"), run) == 2
    assert "invalid TOML" in capsys.readouterr().err


def test_a_size_replaces_an_inherited_pattern(tmp_path):
    spec = parse_spec(_spec(tmp_path, """
[defaults]
size = "16KiB"
[[requirement]]
case = { method = "load", pattern = "1024x160B" }
max_ratio_to = { size = "160KiB" }
"""))
    requirement = spec.requirements[0]
    assert requirement.case.pattern == "1024x160B" and requirement.reference.pattern == "160KiB"


def test_example_specs_parse():
    """Every example spec parses into requirements, and every one the README and docs name is
    among them (an empty or moved examples folder fails, not passes)."""
    import re

    root = EXAMPLES.parent.parent
    named = {match for doc in (root / "README.md", *sorted((root / "docs").glob("*.md")))
             for match in re.findall(r"examples/acceptance/([\w.-]+\.toml)", doc.read_text())}
    found = {path.name for path in EXAMPLES.glob("*.toml")}
    assert named >= {"local-dram.toml", "beluga-cxl.toml", "serving-gpu.toml"}, named
    assert found >= named, named - found
    for name in sorted(found):
        assert parse_spec(EXAMPLES / name).requirements, name


def test_without_a_run_it_measures_exactly_the_cases_the_spec_needs(tmp_path, capsys):
    spec = _spec(tmp_path, """
[run]
budget = "0.02"
[[requirement]]
name = "warm 1 KiB load no slower than 4 KiB"
case = { method = "load", size = "1KiB" }
max_ratio_to = { size = "4KiB", ratio = 1.0 }
[[requirement]]
name = "pool store"
case = { method = "store", region = "numa:7", size = "1KiB" }
max = "1ms"
""")
    code = main(["accept", spec, "--out", str(tmp_path / "store")])
    out = capsys.readouterr().out
    assert code == 1  # the numa:7 requirement cannot be measured here
    measured = load("latest:accept", tmp_path / "store").cases.set_index("case_id")["status"].to_dict()
    assert measured == {"load/dram/wb/1KiB": "ok", "load/dram/wb/4KiB": "ok",
                        "store/numa:7/wb/1KiB": "skipped"}
    assert "1 passed, 1 failed" in out


def test_output_paths_that_cannot_be_written_are_usage_errors(tmp_path, run, capsys):
    spec = str(EXAMPLES / "local-dram.toml")
    assert _accept(tmp_path, spec, run, "--junit", str(tmp_path)) == 2
    assert _accept(tmp_path, spec, run, "--json", str(tmp_path / "nowhere" / "v.json")) == 2
    err = capsys.readouterr().err
    assert "--junit" in err and "is a directory" in err
    assert "--json" in err and "does not exist" in err


def test_a_param_at_its_default_is_the_same_case(tmp_path, run, capsys):
    assert Case("load", "dram", params=(("drain", "before"),)).id == "load/dram/wb/16KiB"
    assert Case("load", "dram", params=(("drain", "none"),)).id == "load/dram/wb/16KiB/drain=none"
    spec = _spec(tmp_path, """
[[requirement]]
case = { method = "load", size = "16KiB", params = { drain = "before" } }
max = "3us"
""")
    assert _accept(tmp_path, spec, run) == 0  # the stored default row is found
    assert "1 passed, 0 failed" in capsys.readouterr().out


class _NoRunner:
    """Stands in for the runner: records how many processes accept asked for, measures nothing."""

    asked: ClassVar[list[int]] = []
    placed: ClassVar[list[int]] = []  # the page placements each process was to draw

    def __init__(self, inventory, settings, store, *args, processes: int = 1, **kwargs):
        _NoRunner.asked.append(processes)
        _NoRunner.placed.append(settings.placements)

    def run(self, cases) -> None:
        pass


@pytest.mark.parametrize("run_table, extra, processes", [
    ('budget = "0.5"', [], 32),  # what `nearlocal run --budget 0.5 --for-gate` uses
    ('budget = "0.02"', [], 1),
    ('budget = "0.5"\nprocesses = 2', [], 2),
    ('budget = "0.5"\nprocesses = 2', ["--processes", "3"], 3),
])
def test_accept_measures_with_runs_default_processes(tmp_path, monkeypatch, capsys, run_table,
                                                      extra, processes):
    from nearlocal.engine import runner

    monkeypatch.setattr(runner, "Runner", _NoRunner)
    _NoRunner.asked = []
    spec = _spec(tmp_path, f'[run]\n{run_table}\n[[requirement]]\ncase = {{ method = "load" }}\n'
                           'max = "1s"\n')
    assert main(["accept", spec, "--out", str(tmp_path / "store"), *extra]) == 1  # not measured
    assert _NoRunner.asked == [processes]
    assert load("latest:accept", tmp_path / "store").meta["processes"] == processes


@pytest.mark.parametrize("run_table, extra, placements", [
    ('budget = "0.02"', [], 2),  # `nearlocal run`'s default
    ('budget = "0.02"\nplacements = 4', [], 4),
    ('budget = "0.02"\nplacements = 4', ["--placements", "1"], 1),
])
def test_the_specs_run_table_takes_placements(tmp_path, monkeypatch, run_table, extra,
                                              placements):
    from nearlocal.engine import runner

    monkeypatch.setattr(runner, "Runner", _NoRunner)
    _NoRunner.placed = []
    spec = _spec(tmp_path, f'[run]\n{run_table}\n[[requirement]]\ncase = {{ method = "load" }}\n'
                           'max = "1s"\n')
    assert main(["accept", spec, "--out", str(tmp_path / "store"), *extra]) == 1  # not measured
    assert _NoRunner.placed == [placements]


def test_a_plain_size_has_one_spelling_in_a_case_id():
    from nearlocal.core.cases import Case

    ids = {Case("load", "dram", pattern=p).id for p in ("16384", "16KiB", "16 KiB", "16k")}
    assert ids == {"load/dram/wb/16KiB"}
    assert Case("load", "dram", pattern="1024x160B").pattern == "1024x160B"


# ---------------------------------------------------------------- verdicts kept in the run



def _report_lead(tmp_path: Path, run: str, capsys) -> str:
    capsys.readouterr()
    assert main(["report", run, "--out", str(tmp_path)]) == 0
    return capsys.readouterr().out


def test_the_verdicts_are_kept_in_the_run_and_the_report_reads_them(tmp_path, run, capsys):
    import hashlib
    import json

    spec = Path(_spec(tmp_path, TWO_REQUIREMENTS))
    assert _accept(tmp_path, str(spec), run) == 1
    assert f"verdicts kept in {tmp_path / run / 'run.json'}" in capsys.readouterr().out
    (kept,) = json.loads((tmp_path / run / "run.json").read_text())["acceptance"]
    assert kept["spec"] == str(spec.resolve())
    assert kept["spec_sha256"] == hashlib.sha256(spec.read_bytes()).hexdigest()
    assert [(v["requirement"], v["case"], v["measured"], v["bound"], v["passed"], v["reason"])
            for v in kept["verdicts"]] == [
        ("warm 16 KiB load within 3us", "load/dram/wb/16KiB", 100.0, 3000.0, True, ""),
        ("warm 16 KiB load under 50 ns", "load/dram/wb/16KiB", 100.0, 50.0, False, "")]
    report = _report_lead(tmp_path, run, capsys)
    assert ("FAIL: spec.toml, 1 of 2 requirements failed (run " f"{run}): warm 16 KiB load "
            "under 50 ns (measured 100.0 ns, bound median_ns <= 50.0 ns).") in report
    assert "Judged again" not in report
    spec.write_text(TWO_REQUIREMENTS.replace("max = 50", "max = 500"))  # would pass now
    assert _report_lead(tmp_path, run, capsys) == report
    spec.unlink()
    assert _report_lead(tmp_path, run, capsys) == report


def test_a_report_of_another_run_of_the_host_shows_the_latest_kept_verdicts(tmp_path, run,
                                                                            capsys):
    from nearlocal.report.tables import build_report

    spec = _spec(tmp_path, TWO_REQUIREMENTS)
    assert _accept(tmp_path, spec, run) == 1
    passing = tmp_path / "passing.toml"
    passing.write_text(TWO_REQUIREMENTS.replace("max = 50", "max = 500"))
    assert _accept(tmp_path, str(passing), run) == 0
    Path(spec).write_text(passing.read_text())
    assert _accept(tmp_path, spec, run) == 0  # the same spec and pool: its entry replaced
    assert _accept(tmp_path, spec, run, "--region", "dram") == 0  # another pool: one more
    Path(spec).unlink()
    store = Store.create(tmp_path, {"suite": "test", "host_id": "h"})
    store.add_case({**row_facts(Case("load", "dram", "wb", "1KiB")), "status": "skipped",
                    "reason": "not this time"})
    plain = load(store.finish())
    lead = build_report([plain]).sections[0].lead
    assert [line.split(",")[0] for line in lead if line.startswith(("PASS", "FAIL"))] == \
        ["PASS: passing.toml", "PASS: spec.toml", "PASS: spec.toml (pool dram)"]


def test_damaged_kept_verdicts_are_one_line(tmp_path, run, capsys):
    import json

    meta_path = tmp_path / run / "run.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "acceptance": [{"verdicts": [{"passed": "yes"}]}]}))
    assert main(["report", run, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "field acceptance[0].verdicts[0].passed is a string 'yes', expected true or false" in err


def test_a_run_still_being_written_is_not_amended(tmp_path):
    from nearlocal.errors import UsageError
    from nearlocal.store.meta import update_run_meta

    store = Store.create(tmp_path, {"suite": "test", "host_id": "h"})
    with pytest.raises(UsageError, match="is not finished"):
        update_run_meta(store.path, "acceptance", lambda old: [])
    assert "acceptance" not in load(store.path).meta


def test_two_amendments_at_once_both_keep_their_verdicts(tmp_path, run):
    """Issue 56: two `accept`s amending one run at once could lose a write (each read run.json
    before the other wrote it). Two processes here each read, wait, then add their entry: the
    lock on the run's directory makes the second read the first's entry."""
    import subprocess
    import sys

    code = ("import sys, time\n"
            "from nearlocal.store.meta import update_run_meta\n"
            "def add(old):\n"
            "    time.sleep(0.5)  # between the read and the write: the other one reads now\n"
            "    return [*(old or []), {'spec': sys.argv[2], 'title': sys.argv[2], 'verdicts': []}]\n"
            "update_run_meta(sys.argv[1], 'acceptance', add)\n")
    root = Path(__file__).resolve().parent.parent
    amending = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / run), name],
                                 cwd=root, stderr=subprocess.PIPE, text=True)
                for name in ("a.toml", "b.toml")]
    for process in amending:
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
    kept = load(run, tmp_path).meta["acceptance"]
    assert sorted(entry["spec"] for entry in kept) == ["a.toml", "b.toml"]
