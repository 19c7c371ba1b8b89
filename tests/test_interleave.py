"""interleave:...: every 2 MiB chunk maps to the expected node or device (fake sysfs trees where
the box has one node; real mappings of files standing in for devices)."""

from __future__ import annotations

import numpy as np
import pytest

from nearlocal.cpu.threads import region_node
from nearlocal.errors import UsageError
from nearlocal.probe import probe
from nearlocal.regions import interleave as il
from nearlocal.regions import parse_region, region_kind
from nearlocal.sysroot import SysRoot
from tests.fakesys import cxl_box

MiB = 1 << 20


@pytest.fixture
def cxl_inventory(tmp_path):
    return probe(SysRoot(cxl_box(tmp_path)), calibrate=False, gpu=False)


def test_chunk_map_stripes_round_robin():
    chunks = il.chunk_map(7 * il.CHUNK - 5, 3)
    assert [t for _, t, _ in chunks] == [0, 1, 2, 0, 1, 2, 0]
    assert [o for o, _, _ in chunks] == [i * 2 * MiB for i in range(7)]
    assert [o for _, _, o in chunks] == [0, 0, 0, 2 * MiB, 2 * MiB, 2 * MiB, 4 * MiB]


def test_spec_against_a_two_node_box(cxl_inventory):
    kind = region_kind(parse_region("interleave:0,1"))
    kind.validate(parse_region("interleave:0,1"), cxl_inventory)
    assert kind.unavailable(parse_region("interleave:0,1"), cxl_inventory) is None
    assert "interleave:0,1" in kind.instances(cxl_inventory)
    assert not kind.user_owned(parse_region("interleave:1,0"))
    assert region_node("interleave:1,0") == 1
    for bad, match in (("interleave:0,5", "node 5 does not exist"), ("interleave:", "needs"),
                       ("interleave:0,/dev/dax0.0", "all NUMA node numbers"),
                       ("interleave:1,1", "twice")):
        with pytest.raises(UsageError, match=match):
            kind.validate(parse_region(bad), cxl_inventory)


def test_every_chunk_is_bound_to_its_node():
    calls = []
    address, unmap = il.map_nodes([0, 1], 5 * il.CHUNK, bind=lambda a, n, node: calls.append(
        (a, n, node)))
    try:
        assert address % il.CHUNK == 0
        assert calls == [(address + i * il.CHUNK, il.CHUNK, [0, 1][i % 2]) for i in range(5)]
    finally:
        unmap()


def test_real_region_on_this_box_reads_back_its_placement():
    inventory = probe(calibrate=False, gpu=False)
    node = inventory.numa[0].node
    spec = parse_region(f"interleave:{node}")
    region = region_kind(spec).open(spec, 3 * il.CHUNK + 100, "wb", False)
    try:
        assert region.array.size == 3 * il.CHUNK + 100 and region.writable
        assert (region.array[:4096] != 0).any()  # faulted in with the fill pattern
        assert region.info["chunks_on_expected_node"] == "4/4"
    finally:
        region.close()


def test_device_chunks_come_from_the_expected_device_and_offset(tmp_path):
    paths = []
    for k in range(3):  # files stand in for /dev/daxX.Y: the same shared MAP_FIXED mappings
        path = tmp_path / f"dev{k}"
        data = np.zeros(3 * il.CHUNK, np.uint8)
        for j in range(3):
            data[j * il.CHUNK:(j + 1) * il.CHUNK] = 10 * k + j  # device k, its chunk j
        path.write_bytes(data.tobytes())
        paths.append(str(path))
    size = 7 * il.CHUNK
    address, unmap = il.map_files(paths, size, writable=False)
    try:
        array = il._array(address, size, False)
        for offset, target, target_offset in il.chunk_map(size, 3):
            chunk = array[offset:offset + il.CHUNK]
            assert (chunk == 10 * target + target_offset // il.CHUNK).all()
        assert not array.flags.writeable
    finally:
        unmap()


def test_devdax_target_with_an_offset_is_refused(cxl_inventory):
    spec = parse_region("interleave:/dev/dax0.0@2M,/dev/dax1.0")
    with pytest.raises(UsageError, match="@offset") as caught:
        region_kind(spec).validate(spec, cxl_inventory)
    assert "\n" not in str(caught.value)
    with pytest.raises(UsageError, match="@offset"):  # never reaches os.open of the literal
        region_kind(spec).open(spec, il.CHUNK, "wb", False)


def test_too_large_node_interleave_is_refused_before_anything_is_created(tmp_path, monkeypatch):
    from nearlocal.regions import capacity_problem, check_capacity

    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(cxl_box(tmp_path)))
    spec = parse_region("interleave:0,1")
    capacity, where = region_kind(spec).capacity(spec)
    # node 1 (67000000 kB free) takes every other chunk: twice its share less 10%, not the sum
    per_node = int(67000000 * 1024 * 0.9) // il.CHUNK * il.CHUNK
    assert capacity == 2 * per_node and "node 1" in where
    assert capacity_problem(spec, capacity) is None
    assert capacity_problem(spec, 100 << 30) is None
    problem = capacity_problem(spec, 130 << 30)  # less than the nodes' summed free memory
    assert problem and "cannot hold" in problem and "\n" not in problem
    with pytest.raises(UsageError, match="cannot hold"):
        check_capacity(spec, 130 << 30)
    one = parse_region("interleave:0")
    assert region_kind(one).capacity(one)[0] == int(200000000 * 1024 * 0.9) // il.CHUNK * il.CHUNK
    (tmp_path / "proc").mkdir(exist_ok=True)
    (tmp_path / "proc" / "meminfo").write_text("MemAvailable:    1048576 kB\n")
    assert capacity_problem(spec, 1 << 30) and "MemAvailable" in capacity_problem(spec, 1 << 30)
    dax = parse_region("interleave:/dev/dax0.0,/dev/dax1.0")
    assert region_kind(dax).capacity(dax) is None  # device sizes are checked when opened
