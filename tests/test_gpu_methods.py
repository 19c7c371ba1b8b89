"""GPU methods, regions and suites on a box without a GPU: every case is skipped with its reason,
input errors are exit-2 errors, and none of it needs cupy."""

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from nearlocal.core.cases import Case, unavailable, validate
from nearlocal.core.methods import load_methods
from nearlocal.core.patterns import parse_pattern
from nearlocal.core.suites import suite_cases
from nearlocal.errors import UsageError
from nearlocal.frontends.cli import main
from nearlocal.gpu.copy_sessions import regular_strides
from nearlocal.gpu.layerstream import layer_stream_summary
from nearlocal.gpu.suites import GPU_PATTERNS, MAPPED_HOST, SERVING_PATTERNS
from nearlocal.probe import probe
from nearlocal.probe.gpu import GpuDevice, GpuInfo
from nearlocal.store import load

GPU_METHODS = ("cuda-memcpy", "cuda-memcpy-async", "cuda-memcpy-batch", "cuda-memcpy-2d",
               "gather-kernel", "scatter-kernel", "zero-copy-kernel", "peer-memcpy",
               "peer-kernel", "layer-stream")


@pytest.fixture(scope="module")
def inventory():
    return probe(calibrate=False, gpu=False)


def _with_gpus(inventory, count, peer=True, runtime=12080):
    devices = [GpuDevice(i, "Fake H100", 80 << 30, "9.0") for i in range(count)]
    info = GpuInfo(devices=devices, driver_version=runtime, runtime_version=runtime,
                   peer_access=[[peer and i != j for j in range(count)] for i in range(count)])
    return dataclasses.replace(inventory, gpu=info)


def test_every_gpu_method_is_registered_with_family_gpu():
    methods = load_methods()
    for name in GPU_METHODS:
        assert methods[name].marker == "gpu"
        assert "gpu" in methods[name].markers
        assert "timing" in methods[name].params
    assert "nvlink" in methods["peer-kernel"].markers


def test_no_gpu_reason_names_the_missing_stack(inventory):
    for name in GPU_METHODS:
        reason = load_methods()[name].unavailable(inventory)
        assert reason and reason.startswith("no GPU")


def test_reasons_for_one_gpu_old_cuda_and_no_peer_access(inventory):
    methods = load_methods()
    one = _with_gpus(inventory, 1, runtime=12040)
    assert methods["peer-memcpy"].unavailable(one) == "fewer than 2 GPUs (this box has 1)"
    assert methods["layer-stream"].unavailable(one) == "fewer than 2 GPUs (this box has 1)"
    assert "CUDA >= 12.8" in methods["cuda-memcpy-batch"].unavailable(one)
    assert methods["cuda-memcpy"].unavailable(one) is None
    unpeered = _with_gpus(inventory, 2, peer=False)
    assert methods["peer-memcpy"].unavailable(unpeered) is None  # staged through the host
    assert "no peer access" in methods["peer-kernel"].unavailable(unpeered)
    assert methods["peer-kernel"].unavailable(_with_gpus(inventory, 2)) is None


def test_every_gpu_method_names_a_broken_nvrtc_in_one_line(inventory):
    """Every session's device clock queues the work behind a kernel NVRTC compiles."""
    two = _with_gpus(inventory, 2)
    two.gpu.nvrtc = "NVRTC is not usable through cupy (OSError: libnvrtc.so.13): install it"
    methods = load_methods()
    for name in GPU_METHODS:
        reason = methods[name].unavailable(two)
        assert reason.startswith("NVRTC is not usable") and "\n" not in reason, name


def test_nothing_imports_numba_cuda():
    code = ("import sys, nearlocal.kernels.cuda, nearlocal.gpu.methods, nearlocal.gpu.timing; "
            "assert not any(m.startswith(('numba_cuda', 'numba.cuda')) for m in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_gpu_regions_validate_and_explain(inventory):
    two = _with_gpus(inventory, 2)
    case = Case("peer-memcpy", "gpu:1", "wb", "64KiB", peer="gpu:0")
    validate(case, two)
    assert unavailable(case, two, allow_write=False) is None
    assert unavailable(Case("peer-memcpy", "gpu:3", peer="gpu:0"), two, False) == \
        "GPU 3 does not exist: this box has 2 GPUs"
    assert unavailable(Case("gather-kernel", "registered:dram", peer="gpu:0"), two, False) is None
    assert unavailable(Case("load", "pinned"), two, False) is None  # CPU methods run on pinned
    assert unavailable(Case("load", "pinned"), inventory, False).startswith("no GPU")
    # a GPU region under test needs a GPU method; a host method cannot take a GPU peer
    assert "not on gpu ones" in unavailable(Case("load", "gpu:0"), two, False)
    assert "not a host one" in unavailable(Case("gather-kernel", "pinned"), two, False)
    for bad, message in (("gpu:x", "use gpu:K"), ("registered:gpu:0", "cannot register"),
                         ("registered:pinned", "cannot register"), ("registered:", "needs the")):
        with pytest.raises(UsageError, match=message):
            validate(Case("cuda-memcpy", bad, peer="gpu:0"), two)


@pytest.mark.parametrize(("method", "params", "message"), [
    ("gather-kernel", (("timing", "wall"),), "timing='wall' is not valid"),
    ("gather-kernel", (("width", "12"),), "valid widths are 4, 8, 16"),
    ("gather-kernel", (("group", "3"),), "group 3 must divide the 128 threads"),
    ("zero-copy-kernel", (("fill", "256"),), "fill=256 is out of range"),
    ("layer-stream", (("copy", "dma"),), "copy='dma' is not valid"),
    ("cuda-memcpy", (("timing", "soon"),), "timing='soon' is not valid"),
])
def test_bad_parameter_values_are_refused_before_the_run(inventory, method, params, message):
    region = "gpu:1" if method == "layer-stream" else "pinned"
    with pytest.raises(UsageError, match=message):  # also on a box without a GPU
        validate(Case(method, region, "wb", "64KiB", peer="gpu:0", params=params), inventory)


def test_gpu_suite_is_all_skipped_with_reasons(tmp_path, inventory):
    if probe(calibrate=False).gpu.devices:
        pytest.skip("this box has a GPU: the suite runs for real")
    assert main(["run", "--suite", "gpu", "--budget", "0.05", "--out", str(tmp_path),
                 "--quiet"]) == 0
    cases = load(None, tmp_path).cases
    wanted = {*GPU_PATTERNS, *SERVING_PATTERNS}
    assert set(cases["pattern"]) == wanted and {"pinned", "registered:dram"} <= set(cases["region"])
    assert {"cuda-memcpy", "gather-kernel"} <= set(cases["method"])
    assert (cases["status"] == "skipped").all()
    assert cases["reason"].str.startswith("no GPU").all()


def test_gpu_suite_times_serving_shapes_on_mapped_host(inventory):
    """The papers' shapes keep their 60 cases, ids and order; serving's qwen2.5-32b blocks and a
    64 MiB layer follow on pinned and registered memory, by the API copies (cudaMemcpy2DAsync only
    where the fragments are one regular stride) and the gather / scatter kernels, device timing."""
    cases = suite_cases("gpu")
    assert len(cases) == 92 and len({c.id for c in cases}) == 92
    papers, serving = cases[:60], cases[60:]
    assert {c.pattern for c in papers} == set(GPU_PATTERNS)
    assert papers[0].id == "cuda-memcpy/pinned/wb/1024x160B/peer=gpu:0"
    assert papers[-1].id == "cuda-memcpy-async/dram/wb/64KiB/peer=gpu:0"
    assert {c.pattern for c in serving} == set(SERVING_PATTERNS) and "64MiB" in SERVING_PATTERNS
    for region in MAPPED_HOST:
        for pattern in SERVING_PATTERNS:
            methods = {c.method for c in serving if c.region == region and c.pattern == pattern}
            two_d = regular_strides(parse_pattern(pattern).frags) is not None
            assert methods == {"cuda-memcpy", "cuda-memcpy-async", "cuda-memcpy-batch",
                               "gather-kernel", "scatter-kernel"} | ({"cuda-memcpy-2d"} if two_d else set())
    for case in serving:
        assert not case.params and case.peer == "gpu:0"
        region_bytes, peer_bytes = case.spans()
        assert region_bytes <= 64 << 20 and peer_bytes <= 64 << 20  # a 64 MiB pinned region at most
        validate(case, inventory)
        assert unavailable(case, inventory, False)  # skipped here, with a reason
    shapes = {p: parse_pattern(p) for p in SERVING_PATTERNS}
    assert [(s.count, s.fragment_bytes, s.total_bytes) for s in shapes.values()] == [
        (512, 32 << 10, 16 << 20), (4, 4 << 20, 16 << 20), (1, 64 << 20, 64 << 20)]


def test_swiftcache_suite_names_peer_and_layer_cases(inventory):
    cases = suite_cases("swiftcache")
    assert {c.method for c in cases} >= {"peer-memcpy", "peer-kernel", "layer-stream"}
    assert {c.access for c in cases if c.method == "peer-kernel"} == {"read", "write"}
    for case in cases:
        validate(case, inventory)
        # every GPU case is skipped here; S2's SSD row (file-read, storage/) runs anywhere
        assert unavailable(case, inventory, False) or case.method == "file-read"


def test_regular_strides_finds_2d_copies():
    table = np.array([[0, 0, 160], [384, 160, 160], [768, 320, 160]])
    assert regular_strides(table) == (384, 160, 160, 3)
    assert regular_strides(np.array([[0, 0, 65536]])) == (65536, 65536, 65536, 1)
    assert regular_strides(np.array([[0, 0, 16], [40, 16, 16], [100, 32, 16]])) is None
    assert regular_strides(np.array([[0, 0, 16], [40, 16, 8]])) is None


def test_layer_stream_summary_flags_hidden_and_exposed_transfers():
    hidden = layer_stream_summary(np.full(32, 40e3), pass_ns=3.25e6, compute_pass_ns=3.2e6,
                                  edge_ns=20e3, compute_ns=100e3)
    assert hidden["hides_behind_compute"] and hidden["round_trip_fits_compute"]
    exposed = layer_stream_summary(np.full(32, 180e3), pass_ns=6.0e6, compute_pass_ns=3.2e6,
                                   edge_ns=20e3, compute_ns=100e3)
    assert not exposed["hides_behind_compute"] and not exposed["round_trip_fits_compute"]
    assert exposed["exposed_ns"] == pytest.approx(6.0e6 - 3.2e6 - 20e3)


def test_core_does_not_import_cupy():
    code = ("import sys; from nearlocal.core.suites import suite_cases; "
            "suite_cases('gpu'); suite_cases('swiftcache'); "
            "import nearlocal.gpu.regions, nearlocal.gpu.methods; "
            "assert 'cupy' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
