"""The default run measures what the box has: quick adds every non-local CPU memory."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nearlocal.core import cases as case_rules
from nearlocal.core.suites import Suite, extend_suite, get_suite, register_suite, suite_cases
from nearlocal.cpu.pool import mlc_cases, pool_note, pool_regions, quick_pool_cases
from nearlocal.probe import probe
from nearlocal.sysroot import SysRoot
from tests.fakesys import cxl_box, write


def node0(inventory):  # the fake box's CPUs 0-1 are node 0's, whatever CPU runs the test
    return 0


def test_quick_adds_the_pool_of_a_cxl_box(tmp_path):
    inventory = probe(SysRoot(cxl_box(tmp_path)), calibrate=False, gpu=False)
    assert pool_regions(inventory, node0) == ["devdax:/dev/dax0.0", "numa:1"]
    cases = quick_pool_cases(inventory, node0)
    pool = {c.region for c in cases if c.method != "chase"}
    assert pool == {"devdax:/dev/dax0.0", "numa:1"}  # read methods on every pool region
    assert {c.method for c in cases} == {"chase", "load", "nt-load", "clflush-load",
                                         "clflushopt-load", "memcpy"}  # memcpy: the pool's gather
    chased = {c.region for c in cases if c.method == "chase"}
    assert chased == {"dram", "devdax:/dev/dax0.0", "numa:1"}
    assert all(c.access == "read" for c in cases)
    devdax = next(c for c in cases if c.method == "load" and c.region.startswith("devdax"))
    assert not devdax.writes_region  # read-only: the pool is never written
    chase = next(c for c in cases if c.method == "chase" and c.region.startswith("devdax"))
    assert "--allow-write" in case_rules.unavailable(chase, inventory, allow_write=False)
    assert pool_note(inventory, node0) == \
        "quick also measures non-local memory: devdax:/dev/dax0.0, numa:1"


def test_a_second_socket_is_a_numa_region(tmp_path):
    root = cxl_box(tmp_path)
    write(root, "/sys/devices/system/node/node2/cpulist", "64-127")
    write(root, "/sys/devices/system/node/node2/meminfo", "Node 2 MemTotal:       1000 kB")
    inventory = probe(SysRoot(root), calibrate=False, gpu=False)
    assert pool_regions(inventory, node0)[-2:] == ["numa:1", "numa:2"]  # CPU-less node first
    assert pool_regions(inventory, lambda _: 2) == ["devdax:/dev/dax0.0", "numa:1", "numa:0"]


def one_node_box(root: Path) -> Path:
    """The CXL box without its pool: one node with CPUs and memory, no CXL, no device-dax."""
    cxl_box(root)
    for path in ("sys/devices/system/node/node1", "sys/bus/dax", "sys/bus/cxl", "dev/dax0.0"):
        target = root / path
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    write(root, "/sys/devices/system/node/node0/distance", "10")
    return root


def test_one_node_box_says_so_in_one_line(tmp_path):
    inventory = probe(SysRoot(one_node_box(tmp_path)), calibrate=False, gpu=False)
    assert len(inventory.numa) == 1 and not inventory.dax
    assert pool_regions(inventory, node0) == []
    assert pool_note(inventory, node0) == ("this box has 1 NUMA node and no device-dax pool: quick "
                                           "measures local memory only (nothing to compare it "
                                           "with)")
    cases = quick_pool_cases(inventory, node0)
    assert cases and {(c.method, c.region) for c in cases} == {("chase", "dram")}


def test_this_boxs_note_names_what_its_probe_found():
    """Whatever box runs this: the note is one line naming exactly the pool regions its probe
    lists, or saying there are none, and quick reads exactly those (chase on dram always)."""
    from nearlocal.cpu.threads import local_node

    inventory = probe(calibrate=False, gpu=False)
    node = local_node(inventory.numa)  # read once: the process may move between CPUs

    def here(_inventory):
        return node

    regions = pool_regions(inventory, here)
    note = pool_note(inventory, here)
    assert "\n" not in note
    if regions:
        assert note == "quick also measures non-local memory: " + ", ".join(regions)
    else:
        assert note.endswith("quick measures local memory only (nothing to compare it with)")
        assert f"this box has {len(inventory.numa)} NUMA node" in note
    read = {c.region for c in quick_pool_cases(inventory, here) if c.method != "chase"}
    assert read == set(regions)
    assert any(c.method == "chase" and c.region == "dram" for c in suite_cases("quick"))


def test_mlc_suite_covers_idle_peak_and_loaded(tmp_path):
    inventory = probe(SysRoot(cxl_box(tmp_path)), calibrate=False, gpu=False)
    cases = mlc_cases(inventory, node0)
    loaded = [c for c in cases if c.method == "loaded-chase" and c.region == "numa:1"]
    delays = {c.param_dict.get("delay", "default") for c in loaded}  # the default is no param
    assert len(delays) == len(loaded) > 5
    assert {c.method for c in cases if c.param_dict.get("threads") == "all"} == \
        {"load", "store", "nt-store", "memcpy"}


def test_local_node_is_the_node_of_the_cpu_named(tmp_path):
    from nearlocal.cpu.threads import local_node

    root = cxl_box(tmp_path)
    write(root, "/sys/devices/system/node/node2/cpulist", "64-127")
    inventory = probe(SysRoot(root), calibrate=False, gpu=False)
    assert local_node(inventory.numa, cpu=1) == 0
    assert local_node(inventory.numa, cpu=70) == 2
    assert local_node(root=SysRoot(root), cpu=70) == 2
    assert local_node(inventory.numa, cpu=500) is None


@pytest.mark.parametrize("suite, compares", [("quick", True), ("mlc", True), ("all", True),
                                             ("dsa", False), ("rpc", False), ("kv", False)])
def test_a_suite_says_whether_its_run_compares_the_pool(suite, compares, tmp_path, monkeypatch,
                                                         capsys):
    """`Suite.compares_pool`, set where the suite is declared, decides whether `nearlocal run`
    prints what local memory is compared with. No worker starts: every case fails at once."""
    from nearlocal.engine.workers import MeasuringWorker
    from nearlocal.frontends.cli import main

    assert get_suite(suite).compares_pool is compares
    monkeypatch.setattr(MeasuringWorker, "ask", lambda self, case, message: {
        "status": "failed", "reason": "no worker in this test"})
    assert main(["run", "--suite", suite, "--method", "load", "--size", "4KiB", "--region", "dram",
                 "--budget", "0.02", "--processes", "1", "--out", str(tmp_path)]) == 0
    note = pool_note(probe(calibrate=False, gpu=False), suite=suite)
    assert (note[:40] in capsys.readouterr().out) is compares


def test_only_a_joinable_suite_takes_parts_from_other_families():
    """quick is declared once, joinable: the DSA, pool and serving rows join it from their
    families; a suite not declared joinable refuses a part, even one that came first."""
    from nearlocal.core import suites

    quick = get_suite("quick")
    assert quick.joinable and quick_pool_cases in quick.all_parts()
    assert quick.parts == [suites._quick]  # declared once, in core/suites.py
    with pytest.raises(ValueError, match="not joinable"):
        extend_suite("rpc", lambda: [])
    extend_suite("test-only-later", lambda: [])  # a part may come before its suite's declaration
    try:
        with pytest.raises(ValueError, match="not joinable"):
            register_suite(Suite("test-only-later", "test only", []))
        later = register_suite(Suite("test-only-later", "test only", [], joinable=True))
        assert len(later.all_parts()) == 1
    finally:
        suites.SUITES.pop("test-only-later", None)
        suites._JOINED.pop("test-only-later", None)
