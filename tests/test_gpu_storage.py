"""Issue 23's GPU reload paths on a CPU box: file-read-gpu (file -> pinned bounce -> GPU) and
file-read-gds (kvikio / cuFile) against the cupy test double (tests/gpu_fakecupy.py) and a kvikio
double below: the fake device buffer ends up holding the file's bytes, both clocks give samples,
the row says what its interval holds; without a GPU or kvikio both are skipped with the reason.
Nothing here is a measurement."""

from __future__ import annotations

import dataclasses
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from nearlocal.core.cases import Case, unavailable, validate
from nearlocal.core.methods import load_methods
from nearlocal.core.patterns import parse_pattern
from nearlocal.core.sampling import StoppingRule
from nearlocal.core.suites import suite_cases
from nearlocal.engine.worker import WorkerSettings, measure, open_case
from nearlocal.errors import UsageError
from nearlocal.probe import probe
from nearlocal.probe.gpu import GpuDevice, GpuInfo
from nearlocal.storage.gpu_methods import contiguous_runs
from tests.test_storage import _direct_works

TSC_HZ = 2.0e9
# the sample cap ends a case (a budget could end it before 3 samples on a loaded box)
SETTINGS = WorkerSettings(StoppingRule(budget_s=5.0, min_samples=3, max_samples=4), TSC_HZ, False)
FILE_BYTES = 2 * 2**20 + 4093  # an unaligned tail


@pytest.fixture(scope="module")
def inventory():
    return probe(calibrate=False, gpu=False)


def _with_gpu(inventory):
    info = GpuInfo(devices=[GpuDevice(0, "Fake H100", 80 << 30, "9.0")], driver_version=13000,
                   runtime_version=13000, peer_access=[[False]])
    return dataclasses.replace(inventory, gpu=info)


def _user_file(path: Path) -> bytes:
    data = np.random.default_rng(23).integers(0, 256, FILE_BYTES, np.uint8).tobytes()
    path.write_bytes(data)
    return data


def _assert_gpu_holds_the_file(opened, data: bytes, pattern: str) -> None:
    device = np.asarray(opened.session.ctx.dst.array).view(np.uint8)
    file = np.frombuffer(data, np.uint8)
    for file_off, gpu_off, length in parse_pattern(pattern).frags:
        assert np.array_equal(device[gpu_off:gpu_off + length],
                              file[file_off:file_off + length]), (file_off, gpu_off)


@pytest.mark.parametrize(("pattern", "params"), [
    ("128x4KiB", (("qd", "16"),)),  # scattered 4 KiB pieces, O_DIRECT, io_uring where allowed
    ("3x4097B@10000", (("cache", "cold"),)),  # odd sizes: buffered only
    ("64KiB", (("cache", "warm"), ("engine", "threads"), ("qd", "4"), ("block", "16KiB"),
               ("timing", "e2e"))),
])
def test_file_read_gpu_lands_the_files_bytes_in_the_device_buffer(fake_cupy, tmp_path, pattern,
                                                                   params):
    if dict(params).get("cache", "direct") == "direct" and not _direct_works(tmp_path):
        pytest.skip("this file system refuses O_DIRECT")
    path = tmp_path / "kv.bin"
    data = _user_file(path)
    case = Case("file-read-gpu", f"storage:{path}", pattern=pattern, peer="gpu:0", params=params)
    with open_case(case, TSC_HZ, 0.0, False) as opened:
        device = opened.session.ctx.dst.array
        device[:] = 0
        raw, ns = opened.session.sample(3)
        assert len(raw) == len(ns) == 3 and np.all(ns >= 0)
        _assert_gpu_holds_the_file(opened, data, pattern)
        info = opened.info
    timing = dict(params).get("timing", "device")
    contains = info["e2e_contains" if timing == "e2e" else "device_contains"]
    assert "pinned bounce buffer" in contains and "cudaMemcpyAsync" in contains
    assert info["bounce"].startswith("pinned") and info["engine"] in ("io_uring", "threads")
    assert info["h2d_copies"] == 1  # the pattern is packed in the bounce: one run, one copy
    assert info["file_part_median_ns"] >= 0
    assert info["other_timing_samples"] == 1  # the other clock from one reload, not ten
    assert fake_cupy.cuda.runtime.calls["memcpyAsync"] >= 3
    assert ("before_each_sample" in info) == (dict(params).get("cache") == "cold")
    assert path.read_bytes() == data  # the user's file is never written


def test_file_read_gpu_through_the_worker_gives_a_row(fake_cupy, tmp_path):
    path = tmp_path / "kv.bin"
    _user_file(path)
    case = Case("file-read-gpu", f"storage:{path}", pattern="8x8KiB", peer="gpu:0",
                params=(("cache", "cold"),))
    row, _raw, ns, _placement = measure(case, SETTINGS, 0.0)
    assert row["clock"] == "cuda-event" and row["n_samples"] == len(ns) >= 3
    assert row["info"]["timer_overhead_kind"].startswith("unqueued empty interval")


def test_file_read_gpu_refuses_unaligned_direct_reads(fake_cupy, tmp_path):
    if not _direct_works(tmp_path):
        pytest.skip("this file system refuses O_DIRECT")
    path = tmp_path / "kv.bin"
    _user_file(path)
    case = Case("file-read-gpu", f"storage:{path}", pattern="3x4097B", peer="gpu:0")
    with pytest.raises(UsageError, match="multiples of"), open_case(case, TSC_HZ, 0.0, False):
        pass


class _Future:
    def __init__(self, done: int):
        self.done = done

    def get(self) -> int:
        return self.done


def _fake_kvikio(compat: bool = False) -> types.ModuleType:
    """kvikio's CuFile as plain preads into the (host-backed) fake device array."""

    class CuFile:
        def __init__(self, path, flags="r"):
            self.fd = os.open(path, os.O_RDONLY)

        def pread(self, buf, size, file_offset=0):
            data = os.pread(self.fd, size, file_offset)
            buf[:len(data)] = np.frombuffer(data, np.uint8)
            return _Future(len(data))

        def close(self):
            os.close(self.fd)

    kvikio = types.ModuleType("kvikio")
    kvikio.__version__ = "fake"
    kvikio.CuFile = CuFile
    kvikio.defaults = types.SimpleNamespace(is_compat_mode_preferred=lambda: compat,
                                            get_num_threads=lambda: 4)
    return kvikio


def test_file_read_gds_preads_into_device_memory(fake_cupy, monkeypatch, tmp_path):
    kvikio = _fake_kvikio()
    monkeypatch.setitem(sys.modules, "kvikio", kvikio)
    monkeypatch.setitem(sys.modules, "kvikio.defaults", kvikio.defaults)
    path = tmp_path / "kv.bin"
    data = _user_file(path)
    for timing in ("device", "e2e"):
        case = Case("file-read-gds", f"storage:{path}", pattern="16x20KiB", peer="gpu:0",
                    params=(("timing", timing),))
        with open_case(case, TSC_HZ, 0.0, False) as opened:
            opened.session.ctx.dst.array[:] = 0
            opened.session.sample(2)
            _assert_gpu_holds_the_file(opened, data, "16x20KiB")
            info = opened.info
        assert info["preads"] == 16 and info["kvikio_threads"] == 4
        assert "CuFile.pread" in info["e2e_contains" if timing == "e2e" else "device_contains"]


def test_gpu_reload_methods_are_skipped_with_their_reason(inventory, monkeypatch, tmp_path):
    methods = load_methods()
    case = Case("file-read-gpu", f"storage:{tmp_path / 'x.bin'}", pattern="64KiB", peer="gpu:0")
    gds = dataclasses.replace(case, method="file-read-gds")
    for each in (case, gds):
        validate(each, inventory)
        if not inventory.gpu.devices:
            assert unavailable(each, inventory, False).startswith("no GPU")
    one = _with_gpu(inventory)
    assert methods["file-read-gpu"].unavailable(one) is None
    monkeypatch.setitem(sys.modules, "kvikio", None)  # import kvikio raises ImportError
    reason = methods["file-read-gds"].unavailable(one)
    assert reason.startswith("kvikio is not importable") and "\n" not in reason
    kvikio = _fake_kvikio(compat=True)
    monkeypatch.setitem(sys.modules, "kvikio", kvikio)
    monkeypatch.setitem(sys.modules, "kvikio.defaults", kvikio.defaults)
    assert "compatibility mode" in methods["file-read-gds"].unavailable(one)
    for method in ("file-read-gpu", "file-read-gds"):
        assert methods[method].marker == "gpu" and "storage" in methods[method].markers


@pytest.mark.parametrize(("params", "message"), [
    ((("qd", "0"),), "qd=0 is out of range"),
    ((("timing", "wall"),), "timing='wall' is not valid"),
    ((("cache", "hot"),), "cache='hot'"),
])
def test_bad_parameters_are_refused_before_the_run(inventory, tmp_path, params, message):
    case = Case("file-read-gpu", f"storage:{tmp_path / 'x.bin'}", pattern="64KiB", peer="gpu:0",
                params=params)
    with pytest.raises(UsageError, match=message):
        validate(case, inventory)


def test_swiftcache_carries_both_reload_paths():
    methods = {c.method for c in suite_cases("swiftcache")}
    assert {"file-read", "file-read-gpu", "file-read-gds"} <= methods


def test_contiguous_runs_merge_packed_pieces():
    table = np.array([[0, 0, 10], [40, 10, 10], [80, 30, 5], [100, 35, 5]])
    assert contiguous_runs(table).tolist() == [[0, 20], [30, 10]]
