"""Probes read fake sysfs trees exactly as the kernel lays them out."""

from __future__ import annotations

from nearlocal.probe import probe
from nearlocal.sysroot import SysRoot, parse_cpulist
from tests.fakesys import cxl_box


def test_cpulist_parsing():
    assert parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []


def test_cxl_box(tmp_path):
    inventory = probe(SysRoot(cxl_box(tmp_path)), calibrate=False, gpu=False)
    cpu = inventory.cpu
    assert cpu.model.startswith("Intel(R) Xeon(R) Platinum 8480+")
    assert cpu.logical_cpus == 2
    assert all(cpu.has(f) for f in ("clflushopt", "clwb", "movdir64b", "enqcmd", "avx512f"))
    assert inventory.tsc_hz == 2e9 and inventory.tsc_source == "kernel"
    assert cpu.llc_bytes == 107520 * 1024

    node0, node1 = inventory.numa
    assert node0.cpus == [0, 1] and not node0.likely_cxl
    assert node1.cpus == [] and node1.mem_total_bytes == 64 << 30 and node1.likely_cxl

    cxl = inventory.cxl
    assert cxl.present
    assert cxl.memdevs[0].ram_bytes == 64 << 30 and cxl.memdevs[0].numa_node == 1
    assert cxl.decoders[0].interleave_granularity == 256 and cxl.decoders[0].mode == "ram"
    assert cxl.regions[0].size == 64 << 30 and cxl.regions[0].targets == ["decoder2.0"]

    (dax,) = inventory.dax
    assert (dax.name, dax.size, dax.align, dax.target_node, dax.mode) == (
        "dax0.0", 16 << 30, 2 << 20, 1, "devdax")
    assert dax.dev_present

    (dsa,) = inventory.dsa.devices
    assert dsa.max_engines == 4 and dsa.max_batch_size == 1024
    (wq,) = dsa.work_queues
    assert (wq.mode, wq.size, wq.type, wq.state) == ("dedicated", 16, "user", "enabled")
    assert inventory.dsa.usable_wqs == [wq]

    assert inventory.hugepages.pool(2 << 20).free == 500
    assert inventory.hugepages.thp_mode == "madvise"


def test_box_without_cxl_dax_or_dsa(tmp_path):
    root = tmp_path
    (root / "proc").mkdir()
    (root / "proc/cpuinfo").write_text("processor : 0\nmodel name : Some CPU\nflags : rdtscp\n")
    inventory = probe(SysRoot(root), calibrate=False, gpu=False)
    assert not inventory.cxl.present and inventory.dax == [] and not inventory.dsa.module_loaded
    assert not inventory.cpu.has("clflushopt")


def test_host_id_tracks_hardware(tmp_path):
    a = probe(SysRoot(cxl_box(tmp_path / "a")), calibrate=False, gpu=False)
    b = probe(SysRoot(cxl_box(tmp_path / "b")), calibrate=False, gpu=False)
    assert a.host_id == b.host_id
    b.cpu.model = "another CPU"
    assert a.host_id != b.host_id


def test_pat_memtype_of_a_range(tmp_path):
    from nearlocal.probe.pat import PAT_LIST, memtype

    root = SysRoot(tmp_path)
    assert memtype(root, 0x1000, 64).startswith("unknown")
    listing = tmp_path / PAT_LIST.lstrip("/")
    listing.parent.mkdir(parents=True)
    listing.write_text("PAT memtype list:\n"
                       "PAT: [mem 0x0000001080000000-0x0000001090000000] uncached-minus\n"
                       "PAT: [mem 0x00000000fd000000-0x00000000fe000000] write-combining\n")
    assert memtype(root, 0x1080000000 + 4096, 16384) == "uncached-minus"
    assert memtype(root, 0xfd000000, 64) == "write-combining"
    assert memtype(root, 0x2000000000, 64).startswith("write-back")


def test_dax_resource_is_read(tmp_path):
    from tests.fakesys import write

    root = cxl_box(tmp_path)
    write(root, "/sys/bus/dax/devices/dax0.0/resource", "0x1080000000")
    (dax,) = probe(SysRoot(root), calibrate=False, gpu=False).dax
    assert dax.resource == 0x1080000000


GPU_REGIONS = ("gpu:0", "pinned", "registered:dram")


def _probe_cli(capsys, *argv: str) -> str:
    from nearlocal.frontends.cli import main

    assert main(["probe", *argv]) == 0
    return capsys.readouterr().out


def test_probe_lists_only_regions_a_box_without_a_gpu_can_map(tmp_path, monkeypatch, capsys):
    """Issue 36: the regions a spec can be aimed at are the kinds' instances this box can map;
    the others (the GPU kinds' on a box without one) are named once with the kind's reason."""
    import json
    import sys

    from nearlocal.availability import region_instances, unmappable_regions

    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(cxl_box(tmp_path)))
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy fails: no GPU on this box
    data = json.loads(_probe_cli(capsys, "--json"))
    listed = {r["region"]: r for r in data["regions"]}
    for region in GPU_REGIONS:
        assert not listed[region]["mappable"] and listed[region]["reason"].startswith("no GPU")
    assert listed["dram"]["mappable"] and listed["numa:1"]["mappable"]
    assert listed["devdax:/dev/dax0.0"]["mappable"]
    columns = {r["region"] for r in data["availability"]}
    assert "dram" in columns and not columns & set(GPU_REGIONS)
    inventory = probe(calibrate=False, gpu=True)
    assert not set(region_instances(inventory)) & set(GPU_REGIONS)
    assert set(GPU_REGIONS) <= set(unmappable_regions(inventory))
    text = _probe_cli(capsys)
    regions_line = next(line for line in text.splitlines() if line.startswith("regions "))
    assert "dram" in regions_line and "gpu:0" not in regions_line
    assert any(line.strip().startswith("not here: gpu:0, pinned, registered:dram: no GPU")
               for line in text.splitlines())


def test_probe_lists_the_gpu_regions_of_a_box_with_a_gpu(tmp_path, monkeypatch, capsys):
    import json
    import sys

    from tests.gpu_fakecupy import make_fake_cupy

    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(cxl_box(tmp_path)))
    monkeypatch.setitem(sys.modules, "cupy", make_fake_cupy())
    data = json.loads(_probe_cli(capsys, "--json"))
    assert data["inventory"]["gpu"]["devices"]
    listed = {r["region"]: r for r in data["regions"]}
    assert all(listed[region]["mappable"] and not listed[region]["reason"]
               for region in GPU_REGIONS)
    assert set(GPU_REGIONS) <= {r["region"] for r in data["availability"]}
