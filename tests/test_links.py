"""Links, NUMA nodes, root ports, DDIO and GPU affinity (probe/links.py), read from fake sysfs
trees laid out as the kernel lays them out (tests/fakesys.py linked_box): an Ice Lake-SP box with
DDIO on and off, a GPU's x16 link trained at x8, a GPU across a socket from its CXL adapter."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest

from nearlocal.probe import probe
from nearlocal.probe.links import below_maximum, ddio_commands, ddio_text, gts, link_text
from nearlocal.sysroot import SysRoot
from tests.fakesys import (
    CPUINFO,
    CXL_PORT,
    EPYC_ZEN4_CPUINFO,
    GPU_ADDRESS,
    GPU_PORT,
    ICELAKE_SP_CPUINFO,
    NIC_PORT,
    linked_box,
)


def _topology(root, **kwargs):
    return probe(SysRoot(linked_box(root, **kwargs)), calibrate=False, gpu=False).topology


def test_each_adapter_gpu_and_nic_has_its_link_node_socket_and_root_port(tmp_path):
    links = {link.kind: link for link in _topology(tmp_path).links}
    assert set(links) == {"cxl", "gpu", "nic"}
    gpu, cxl, nic = links["gpu"], links["cxl"], links["nic"]
    assert (gpu.address, gpu.width, gpu.max_width, gpu.numa_node, gpu.socket, gpu.root_port) == (
        GPU_ADDRESS, 8, 16, 0, 0, GPU_PORT)
    assert (cxl.name, cxl.numa_node, cxl.socket, cxl.root_port) == ("mem0", 1, 1, CXL_PORT)
    assert gts(cxl.speed) == 32.0 and (nic.name, nic.root_port) == ("mlx5_0", NIC_PORT)
    text = link_text(dataclasses.asdict(gpu))
    assert "16.0 GT/s PCIe x8 (max 16.0 GT/s PCIe x16)" in text and f"root port {GPU_PORT}" in text


def test_links_reuse_the_cpu_probe_and_one_walk_of_the_pci_devices(tmp_path, monkeypatch):
    """DDIO's CPU check reads the CPU probe's family and model (no second parse of cpuinfo),
    and the BARs and the links share one listing of /sys/bus/pci/devices."""
    from nearlocal.probe.pci import BASE

    listed = []
    real = SysRoot.listdir
    monkeypatch.setattr(SysRoot, "listdir", lambda self, path: listed.append(path) or
                        real(self, path))
    inventory = probe(SysRoot(linked_box(tmp_path)), calibrate=False, gpu=False)
    assert (inventory.cpu.family, inventory.cpu.model_number) == (6, 106)
    assert listed.count(BASE) == 1 and inventory.topology.ddio_reason is None


def test_a_link_trained_below_its_width_is_named(tmp_path):
    topology = dataclasses.asdict(_topology(tmp_path))
    (line,) = below_maximum(topology)
    assert GPU_ADDRESS in line and "x8 of x16" in line
    topology["links"][0]["speed"] = "16.0 GT/s PCIe"  # the CXL adapter at half its speed
    assert any("16 GT/s of 32 GT/s" in text for text in below_maximum(topology))
    assert below_maximum(None) == [] and below_maximum({}) == []


def test_a_gpu_across_a_socket_from_its_adapter(tmp_path):
    pairs = {(p["gpu"], p["peer"]): p for p in _topology(tmp_path).affinity}
    to_cxl, to_nic = pairs[(f"GPU {GPU_ADDRESS}", "mem0")], pairs[(f"GPU {GPU_ADDRESS}", "mlx5_0")]
    assert to_cxl["crosses"] and to_cxl["relation"] == "crosses sockets (0 -> 1)"
    assert not to_nic["crosses"] and to_nic["relation"].startswith("same socket 0")


@pytest.mark.parametrize("on", [True, False])
def test_ddio_is_read_per_root_port_on_an_intel_xeon(tmp_path, on):
    topology = _topology(tmp_path, ddio_on=on)
    assert topology.ddio_reason is None
    ports = {p.root_port: p for p in topology.ddio}
    assert set(ports) == {GPU_PORT, NIC_PORT, CXL_PORT}
    assert {p.state for p in ports.values()} == {"on" if on else "off"}
    assert ports[GPU_PORT].devices == [f"GPU {GPU_ADDRESS}"]
    off, back = ddio_commands(ports[GPU_PORT])
    assert off == f"off: setpci -s {GPU_PORT} 180.b=00 185.b=01"
    assert back == f"on (the defaults): setpci -s {GPU_PORT} 180.b=80 185.b=00"
    line = ddio_text(dataclasses.asdict(topology))
    assert f"{GPU_PORT} {'on' if on else 'off'} (GPU {GPU_ADDRESS})" in line


@pytest.mark.parametrize("cpuinfo, why", [
    (CPUINFO, "family None model None"),  # a Sapphire Rapids name without family/model lines
    (EPYC_ZEN4_CPUINFO, "a virtual machine"),  # the recorded AMD box is a KVM guest
    (EPYC_ZEN4_CPUINFO.replace(" hypervisor", ""), "AMD"),
    (ICELAKE_SP_CPUINFO.replace("model\t\t: 106", "model\t\t: 143"), "model 143"),
])
def test_ddio_is_not_exposed_in_a_vm_on_amd_or_an_undocumented_xeon(tmp_path, cpuinfo, why):
    topology = _topology(tmp_path, cpuinfo=cpuinfo)
    assert topology.ddio == [] and topology.ddio_reason.startswith("not exposed")
    assert why in topology.ddio_reason
    assert ddio_text(dataclasses.asdict(topology)) == topology.ddio_reason


def test_a_config_space_cut_to_64_bytes_is_not_read_as_a_state(tmp_path):
    states = {p.state for p in _topology(tmp_path, ddio_on=None).ddio}
    assert states == {"not exposed (config space is 64 bytes)"}


def test_the_self_check_names_the_link_below_its_maximum(tmp_path):
    from nearlocal.engine.stability.selfcheck import self_check, summary_line

    inventory = probe(SysRoot(linked_box(tmp_path)), calibrate=False, gpu=False).to_dict()
    result = self_check({"inventory": inventory}, pd.DataFrame(), pd.DataFrame())
    (line,) = result["links"]
    assert "x8 of x16" in line
    assert "links trained below their maximum: " + line in summary_line(result)
    assert self_check({}, pd.DataFrame(), pd.DataFrame())["links"] == []


def _inventory(root, **kwargs) -> dict:
    """A run's inventory (report_fixtures') with the fake box's links, its GPU named as the GPU
    probe names it (index 0, the H20 the fixture's rows use as gpu:0), as run.json keeps it."""
    from nearlocal.probe.cpu import probe_cpu
    from nearlocal.probe.gpu import GpuDevice, GpuInfo
    from nearlocal.probe.links import probe_topology
    from nearlocal.probe.rdma import probe_rdma
    from tests.report_fixtures import INVENTORY

    sysroot = SysRoot(linked_box(root, **kwargs))
    gpus = GpuInfo([GpuDevice(0, "H20", 96 << 30, "9.0", pci_bus_id="00000000:17:00.0")])
    topology = probe_topology(sysroot, probe_cpu(sysroot), gpus, probe_rdma(sysroot))
    return json.loads(json.dumps({**INVENTORY, "topology": dataclasses.asdict(topology)}))


def test_the_report_inventory_says_links_ddio_and_affinity(tmp_path):
    from nearlocal.report.sections.inventory import _topology_rows

    meta = {"inventory": json.loads(json.dumps(
        probe(SysRoot(linked_box(tmp_path, ddio_on=False)), calibrate=False, gpu=False).to_dict()))}
    rows = {key[0]: value[0] for key, value in _topology_rows(meta).items()}
    assert "x8 of x16" in rows["links below their maximum"]
    assert f"{GPU_PORT} off" in rows["DDIO"]
    assert "mem0: crosses sockets (0 -> 1)" in rows["GPU affinity"]
    assert rows["nearlocal_pool module"] == "not loaded"
    assert _topology_rows({}) == {}


@pytest.mark.parametrize("on", [True, False])
def test_rows_carry_ddio_at_run_time_and_b10_b11_say_it(tmp_path, on):
    """Each row carries the DDIO its host read at the run's start (report/rows.py: `ddio`,
    `ddio_at`), at the root port of the GPU it moved bytes to; B10's line and B11's say it."""
    from nearlocal.report.rows import prepare
    from nearlocal.report.tables import build_report
    from nearlocal.store import load
    from tests.report_fixtures import full_rows, make_run

    state = "on" if on else "off"
    run = load(make_run(tmp_path / "store", full_rows(), _inventory(tmp_path / "box", ddio_on=on)))
    rows = prepare(run)
    gpu = rows[rows["peer"] == "gpu:0"]
    assert set(gpu["ddio"]) == {state}
    assert set(gpu["ddio_at"]) == {f"{state} at GPU 0 (H20)'s root port {GPU_PORT}"}
    cpu = rows[rows["marker"] == "cpu"]  # no GPU: the box's root ports, all alike
    assert set(cpu["ddio_at"]) == {f"{state} at each of the 3 root ports read"}
    report = build_report([run])
    (b10,) = [n for n in report.section("b9").notes if "uncacheable host memory" in n]
    assert b10.endswith(f"DDIO at run time: {state} at GPU 0 (H20)'s root port {GPU_PORT}")
    b11 = report.section("b11")
    column = [c.name for c in b11.table.columns].index("DDIO")
    assert {r[column] for r in b11.table.rows} == {state}
    assert f"this run: DDIO at run time: {state} at GPU 0 (H20)'s root port {GPU_PORT}" \
        in b11.notes


def test_rows_of_a_vm_and_of_an_old_run_say_not_exposed_and_not_recorded(tmp_path):
    from nearlocal.report.rows import prepare
    from nearlocal.report.tables import build_report
    from nearlocal.store import load
    from tests.report_fixtures import INVENTORY, full_rows, make_run

    vm = _inventory(tmp_path / "vm", cpuinfo=EPYC_ZEN4_CPUINFO)  # a KVM guest
    run = load(make_run(tmp_path / "a", full_rows(), vm))
    assert set(prepare(run)["ddio"]) == {"not exposed"}
    assert "DDIO at run time: not exposed (a virtual machine" in " ".join(
        build_report([run]).section("b9").notes)
    old = load(make_run(tmp_path / "b", full_rows(), INVENTORY))  # stored before links were read
    rows = prepare(old)
    assert set(rows["ddio"]) == {"not recorded"}
    b11 = build_report([old]).section("b11")
    assert any("DDIO at run time: a run stored before nearlocal read the box's links" in n
               for n in b11.notes)


def test_an_mpi_row_carries_the_ddio_of_the_host_that_measured_it(tmp_path):
    from nearlocal.report.rows import prepare
    from nearlocal.store import load
    from tests.report_fixtures import full_rows, make_run

    run = load(make_run(tmp_path / "store", full_rows(), _inventory(tmp_path / "a", ddio_on=True)))
    run.meta["mpi"] = {"hosts": [{"hostname": "a", "rank": 0}, {"hostname": "b", "rank": 1}]}
    run.meta["host_inventories"] = {"0": run.meta["inventory"],
                                    "1": _inventory(tmp_path / "b", ddio_on=False)}
    run.cases["host"] = ["a" if i % 2 else "b" for i in range(len(run.cases))]
    rows = prepare(run)
    assert set(rows[rows["host"] == "a"]["ddio"]) == {"on"}
    assert set(rows[rows["host"] == "b"]["ddio"]) == {"off"}


def test_probe_prints_links_ddio_affinity_and_the_module(tmp_path, monkeypatch, capsys):
    import sys

    from nearlocal.frontends.cli import main

    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(linked_box(tmp_path, ddio_on=True)))
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert main(["probe"]) == 0
    text = capsys.readouterr().out
    assert "x8 of x16" in text and f"root port {GPU_PORT}" in text
    assert f"{GPU_PORT} on (GPU {GPU_ADDRESS})" in " ".join(text.split())
    assert f"setpci -s {GPU_PORT} 180.b=00" in text
    assert "crosses sockets (0 -> 1)" in text
    assert "nearlocal_pool" in text and "load it:" in text
    assert main(["probe", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["inventory"]["topology"]["affinity"][0]["crosses"] is True


def test_the_whatif_names_the_adapter_a_paths_gpu_shares(tmp_path, capsys):
    from nearlocal.frontends.cli import main
    from nearlocal.store import load
    from nearlocal.whatif import Request, inputs_of, whatif
    from nearlocal.whatif.serving import WhatifInputs
    from tests.report_fixtures import INVENTORY, full_rows, make_run

    store = tmp_path / "store"
    run = load(make_run(store, full_rows(), _inventory(tmp_path / "box")))
    paths = {p.path: p for p in whatif(inputs_of(run), Request()).paths}
    assert paths["cxl-pool"].shares == ("GPU 0 (H20) has CXL adapter mem0 to itself "
                                        "(crosses sockets (0 -> 1))")
    assert paths["rdma"].shares == ("GPU 0 (H20) has RDMA NIC mlx5_0 to itself "
                                    "(same socket 0, different root ports)")
    assert paths["cpu-offload"].shares == paths["nvlink"].shares == ""  # no adapter of its own
    assert main(["whatif", "--out", str(store)]) == 0
    assert "cxl-pool: GPU 0 (H20) has CXL adapter mem0 to itself" in capsys.readouterr().out
    assert main(["whatif", "--out", str(store), "--qps", "2", "--requests", "200", "--json",
                 "--path", "cxl-pool"]) == 0  # under load: the path's notes say it too
    (pool,) = json.loads(capsys.readouterr().out)["paths"]
    assert paths["cxl-pool"].shares in pool["notes"]
    old = load(make_run(tmp_path / "old", full_rows(), INVENTORY))  # stored before the links
    pool = next(p for p in whatif(inputs_of(old), Request()).paths if p.path == "cxl-pool")
    assert pool.shares == ("which CXL adapter its GPU shares: not recorded (a run stored before "
                           "nearlocal read the box's links)")
    assert {p.shares for p in whatif(WhatifInputs(), Request()).paths} == {""}  # no box's inputs


def _shared_box() -> dict:
    """GPU 0 under mem0's root port, GPU 1 on the same socket behind another, GPU 2 and mem1 on
    socket 1; one RDMA NIC nowhere near any (no NUMA node)."""
    def link(kind, name, port, socket, index=None):
        return {"kind": kind, "name": name, "address": f"0000:{port}:00.0", "root_port": port,
                "socket": socket, "numa_node": socket, "gpu_index": index}
    return {"links": [link("gpu", "GPU 0 (H100)", "a", 0, 0), link("gpu", "GPU 1 (H100)", "b", 0, 1),
                      link("gpu", "GPU 2 (H100)", "c", 1, 2), link("cxl", "mem0", "a", 0),
                      link("cxl", "mem1", "d", 1)]}


def test_which_gpus_share_an_adapter_and_the_links_per_gpu_bound():
    from nearlocal.probe.links import adapter_shares
    from nearlocal.whatif.paths import SERVING_PATHS
    from nearlocal.whatif.serving import Request, Term, adapter_shared

    topology = _shared_box()
    (one,) = adapter_shares(topology, "cxl", (1,))[0]
    assert (one.gpu, one.adapter, one.sharers, one.crosses) == (
        "GPU 1 (H100)", "mem0", ("GPU 1 (H100)", "GPU 0 (H100)"), False)
    every = adapter_shares(topology, "cxl")[0]  # no GPU measured: every GPU of the box
    assert [(s.gpu, s.adapter) for s in every] == [
        ("GPU 0 (H100)", "mem0"), ("GPU 1 (H100)", "mem0"), ("GPU 2 (H100)", "mem1")]
    assert adapter_shares(topology, "nic") == ([], "the run's inventory lists no RDMA NIC")
    assert adapter_shares({"links": []}, "cxl") == ([], "the run's inventory lists no GPU")
    term = Term("pool->gpu", "", 1, 1, 1.0, "way", "measured", ("row",), gpus=(1,))
    text = adapter_shared(SERVING_PATHS["cxl-pool"], [term], Request(), topology)
    assert text == ("GPU 1 (H100) shares CXL adapter mem0 with GPU 0 (H100) (same socket 0, "
                    "different root ports); 2 GPUs share it on this box: --gpus-per-link 2 "
                    "shares the link as they do (given 1)")
    assert "--gpus-per-link" not in adapter_shared(SERVING_PATHS["cxl-pool"], [term],
                                                   Request(gpus_per_link=2), topology)
