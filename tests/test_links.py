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
    from nearlocal.engine.selfcheck import self_check, summary_line

    inventory = probe(SysRoot(linked_box(tmp_path)), calibrate=False, gpu=False).to_dict()
    result = self_check({"inventory": inventory}, pd.DataFrame(), pd.DataFrame())
    (line,) = result["links"]
    assert "x8 of x16" in line
    assert "links trained below their maximum: " + line in summary_line(result)
    assert self_check({}, pd.DataFrame(), pd.DataFrame())["links"] == []


def test_the_report_inventory_and_b10_b11_say_links_ddio_and_affinity(tmp_path):
    from nearlocal.report.model import RunInfo
    from nearlocal.report.sections.beluga import ddio_notes
    from nearlocal.report.sections.inventory import _topology_rows

    meta = {"inventory": json.loads(json.dumps(
        probe(SysRoot(linked_box(tmp_path, ddio_on=False)), calibrate=False, gpu=False).to_dict()))}
    rows = {key[0]: value[0] for key, value in _topology_rows(meta).items()}
    assert "x8 of x16" in rows["links below their maximum"]
    assert f"{GPU_PORT} off" in rows["DDIO"]
    assert "mem0: crosses sockets (0 -> 1)" in rows["GPU affinity"]
    assert rows["nearlocal_pool module"] == "not loaded"
    assert _topology_rows({}) == {}

    class Data:
        def __init__(self, meta):
            self.meta = meta

    run = RunInfo("1", "r1", "h", "quick", "", "", {})
    (note,) = ddio_notes([run], [Data(meta)])
    assert note.startswith("this run: DDIO at run time: ") and f"{GPU_PORT} off" in note
    (old,) = ddio_notes([run], [Data({"inventory": {}})])
    assert "not recorded" in old


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
