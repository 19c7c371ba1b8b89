"""The command line as a new user meets it: comma lists for every selector, run-id prefixes,
--version and --help, tables that stay readable in a CI log, rows told apart by access / peer /
params (tables and --json), and progress that counts measured cases."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest
from rich.console import Console

from nearlocal.frontends import console as console_module
from nearlocal.frontends.cli import build_parser, main
from nearlocal.frontends.console import case_table
from nearlocal.frontends.selection import pattern_list, region_list, selected_cases
from nearlocal.terminal import print_table
from tests.report_fixtures import make_run, row

TINY = ["--budget", "0.02", "--quiet"]


def _cases(*argv: str):
    return selected_cases(build_parser().parse_args(["run", *argv]))


def test_comma_lists_and_repeated_flags_select_the_same_cases():
    listed = _cases("--method", "nt-store,store", "--attr", "wb,uc", "--size", "16KiB,64KiB",
                    "--region", "dram,dram:thp", "--peer", "dram")
    repeated = _cases("--method", "nt-store", "--method", "store", "--attr", "wb", "--attr",
                      "uc", "--size", "16KiB", "--size", "64KiB", "--region", "dram",
                      "--region", "dram:thp")
    assert listed == repeated and len(listed) == 2 * 2 * 2 * 2
    assert {c.method for c in listed} == {"nt-store", "store"}
    assert len(_cases("--method", "load,load", "--size", "4k,4096")) == 1  # duplicates dropped


def test_region_lists_keep_the_commas_of_region_options():
    assert region_list("--region", ["dram,node=0,numa:1"]) == ["dram:node=0", "numa:1"]
    assert region_list("--region", ["dram:2M,node=0,shm:x", "dram:thp"]) == [
        "dram:2M,node=0", "shm:x", "dram:thp"]
    assert region_list("--region", ["devdax:/dev/dax0.0@1GiB,64MiB,dram"]) == [
        "devdax:/dev/dax0.0@1GiB,64MiB", "dram"]
    assert region_list("--peer", ["gpu:0,gpu:1"]) == ["gpu:0", "gpu:1"]
    assert region_list("--region", ["registered:dram,node=0"]) == ["registered:dram:node=0"]
    assert pattern_list(["1024x160B,16KiB,kv:qwen2.5-32b:flash-attn:dense,rpc:128x64B"]) == [
        "1024x160B", "16KiB", "kv:qwen2.5-32b:flash-attn:dense", "rpc:128x64B"]


@pytest.mark.parametrize("argv, fragment", [
    (["--size", ","], "--size ',' has an empty item"),
    (["--size", "16KiB,"], "--size '16KiB,' has an empty item"),
    (["--method", "load,,store"], "--method 'load,,store' has an empty item"),
    (["--region", ","], "--region ',' has an empty item"),
    (["--method", "load,teleport"], "unknown method 'teleport'"),
    (["--region", "dram,moon"], "unknown dram option 'moon'"),
])
def test_bad_lists_are_one_line_and_exit_2(argv, fragment, capsys, tmp_path):
    assert main(["run", *argv, "--out", str(tmp_path), *TINY]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1


def test_version_and_help_name_suites_methods_and_size_units(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.startswith("nearlocal 0.")
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    unwrapped = "".join(text.split())  # argparse may wrap a method name at its hyphen
    for name in ("quick", "kv", "rpc", "dsa", "gpu", "swiftcache", "all", "clflushopt-load"):
        assert name in unwrapped
    assert "4k = 4KiB = 4096 B" in text and "4KB = 4000 B" in text


# Libraries `nearlocal --help` must not load: each command module loads its own when it runs
HEAVY = ("numpy", "pandas", "numba", "llvmlite", "scipy", "pyarrow", "matplotlib", "rich")


@pytest.mark.parametrize("option", ["--help", "--version"])
def test_the_command_lines_own_help_loads_no_heavy_library(option):
    """Issue 56: `nearlocal --help` took 0.4-0.58 s, most of it `accept`'s module loading the
    spec's cases, the regions, the probe and numpy while the parser was built. What the command
    imported, as the interpreter lists it (-X importtime), through the real entry point."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "nearlocal", option],
                          cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: nearlocal" if option == "--help" else "nearlocal 0.")
    imported = {line.rpartition("|")[2].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "nearlocal.frontends.cli" in imported  # the listing is read right
    loaded = sorted(name for name in imported if name.split(".")[0] in HEAVY)
    assert not loaded, f"nearlocal {option} imported {loaded[:8]}"


def test_a_printed_number_is_rounded_for_a_person_and_json_keeps_it_whole(tmp_path, capsys):
    """Issue 56: `1499.9999999929514 us` (run.json's MPI ping-pong, as the rig printed it). A
    printer rounds a float to a few significant digits; --json and run.json keep the value."""
    from nearlocal.units import format_number

    assert format_number(1499.9999999929514) == "1500"
    assert [format_number(v) for v in (3.1, 0.30000000000000004, 12345.678, 2, "x", None)] == [
        "3.1", "0.3", "12346", "2", "x", "None"]
    assert format_number(0.1 + 0.2, 6) == "0.3" and format_number(1 / 3, 6) == "0.333333"
    assert [format_number(t, 6) for t in ("1499.9999999929514", "1.10", "flush", "20261201",
                                          "nan", "1e-3")] == [
        "1500", "1.10", "flush", "20261201", "nan", "1e-3"]  # stored params are text
    make_run(tmp_path, [row("load", params={"interval_us": 1499.9999999929514})], run_id="r")
    assert main(["show", "r", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "interval_us=1500" in out and "1499.99" not in out
    assert main(["show", "r", "--out", str(tmp_path), "--json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert float(record["params"]["interval_us"]) == 1499.9999999929514  # whole, as stored


def test_run_id_prefixes(tmp_path, capsys):
    a = make_run(tmp_path, [row("load")], run_id="20261201T010203-aaaaaa").name
    make_run(tmp_path, [row("load")], run_id="20261201T010204-bbbbbb")
    assert main(["show", "20261201T010203", "--out", str(tmp_path)]) == 0
    assert a in capsys.readouterr().out
    assert main(["show", "2026", "--out", str(tmp_path)]) == 2
    assert "ambiguous" in capsys.readouterr().err


def test_rows_of_one_run_are_told_apart_in_tables_and_json(tmp_path, capsys):
    rows = [row("rpc-throughput", "shm:rpc", access="write", pattern="rpc:128x64B",
                params={"protocol": p, "qd": q}) for p in ("flush", "coherent") for q in "18"]
    rows += [row("memcpy", "shm:kv", access=a, median=m) for a, m in (("read", 10.0),
                                                                      ("write", 20.0))]
    make_run(tmp_path, rows, run_id="r1")
    assert main(["show", "r1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("| rpc-throughput")]
    assert len(set(lines)) == 4 and any("protocol=flush qd=8" in line for line in lines)
    assert any(line.startswith("| memcpy ") and "| write " in line for line in out.splitlines())
    assert main(["show", "r1", "--out", str(tmp_path), "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert {(r["access"], r["peer"], json.dumps(r["params"], sort_keys=True))
            for r in records if r["method"] == "rpc-throughput"} == {
        ("write", "dram", json.dumps({"protocol": p, "qd": q}, sort_keys=True))
        for p in ("flush", "coherent") for q in "18"}


def test_run_json_carries_access_peer_and_params(tmp_path):
    out = tmp_path / "rows.json"
    assert main(["run", "--method", "load,store", "--size", "64", "--out", str(tmp_path / "s"),
                 "--json", str(out), *TINY]) == 0
    records = {r["method"]: r for r in json.loads(out.read_text())}
    assert records["load"]["access"] == "read" and records["store"]["access"] == "write"
    assert records["load"]["peer"] == "dram" and records["load"]["params"] == {}


def test_tables_off_a_terminal_are_whole_markdown_rows():
    cases = pd.DataFrame([row(m, "shm:a-long-region-name", size=2**20, median=1e5)
                          for m in ("clflush-load", "clflushopt-load")])
    buffer = io.StringIO()
    print_table(case_table(cases, "run x"), Console(file=buffer, width=80))
    lines = buffer.getvalue().splitlines()
    assert lines[0] == "run x" and lines[1].startswith("| method")
    body = [line for line in lines[3:] if line]
    assert len(body) == 2 and "clflushopt-load" in body[1] and "…" not in buffer.getvalue()
    assert len(body[0]) > 80  # the full width, not wrapped at 80 columns


def test_a_narrow_terminal_folds_identifiers_but_never_cuts_them(monkeypatch):
    cases = pd.DataFrame([row(m, "shm:a-long-region-name", size=2**20, median=1e5,
                              params={"qd": "8"}) for m in ("clflush-load", "clflushopt-load")])
    from nearlocal import terminal

    buffer = io.StringIO()
    narrow = terminal._Console(file=buffer, width=80, force_terminal=True, color_system=None)
    for module in (terminal, console_module):  # the printers' console, wherever imported
        monkeypatch.setattr(module, "console", narrow)
    console_module.print_run({"run_id": "x"}, cases)
    text = buffer.getvalue()
    assert "…" not in text and text.count("100.00 us") == 2  # every median is shown
    assert max(len(line) for line in text.splitlines()) <= 80
    first_column = "".join(line.split("│")[1].strip() for line in text.splitlines()
                           if line.startswith("│"))
    for case_id in cases["case_id"]:
        assert case_id in first_column  # folded onto several lines, every character kept


@pytest.mark.parametrize("suite", ["rack", "rpc", "mlc"])
def test_a_suite_aimed_at_a_region_keeps_each_cases_pattern_and_params(suite):
    """--region replaces the region of every suite case; pattern, parameters, access and peer
    stay each case's own (an rpc-* method keeps its rpc: ring, not another method's size)."""
    from dataclasses import replace

    from nearlocal.core.suites import suite_cases

    aimed = _cases("--suite", suite, "--region", "shm:pool-here")
    assert aimed == list(dict.fromkeys(replace(c, region="shm:pool-here", attr="wb")
                                       for c in suite_cases(suite)))
    assert all(c.pattern.startswith("rpc:") for c in aimed if "rpc" in c.method)
    both = _cases("--suite", suite, "--region", "shm:a,shm:b", "--param", "qd=4")
    assert set(both) == {replace(c, region=region, params=tuple({**c.param_dict, "qd": "4"}.items()))
                         for c in aimed for region in ("shm:a", "shm:b")}


def test_a_param_overrides_the_suites_value_and_equal_cases_merge():
    from nearlocal.frontends.cli import build_parser
    from nearlocal.frontends.selection import selected_cases

    cases = selected_cases(build_parser().parse_args(
        ["run", "--suite", "rpc", "--param", "protocol=coherent"]))
    assert {c.param_dict.get("protocol") for c in cases} == {"coherent"}
    assert len({c.id for c in cases}) == len(cases)


def test_region_aims_only_a_suites_pool_cases():
    """pool-vs-rdma: --region moves the pool's transfers and the rack cases to the pool named; the
    RDMA rows stay on each host's own DRAM (Suite.pool_region). A suite without a pool region
    (rdma) has --region replace every case's region."""
    pool = _cases("--suite", "pool-vs-rdma", "--region", "devdax:/dev/dax0.0")
    rdma = [c for c in pool if c.method.startswith("rdma-")]
    others = [c for c in pool if not c.method.startswith("rdma-")]
    assert rdma and {c.region for c in rdma} == {"dram"}
    assert others and {c.region for c in others} == {"devdax:/dev/dax0.0"}
    assert {c.method for c in others} >= {"memcpy", "nt-store", "load", "rack-host-loss"}
    # the what-if's cxl-pool path stands on the pool's gather of a serving read (beyond the LLC)
    assert any(c.method == "memcpy" and c.pattern.startswith("kv:") and c.access == "read"
               for c in others)
    moved = _cases("--suite", "rdma", "--region", "numa:0")
    assert {c.region for c in moved} == {"numa:0"}
