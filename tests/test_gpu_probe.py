"""The GPU probe's NVLink / PCIe reading against an NVML test double laid out as nvidia-ml-py
answers: links to the other GPU are counted per pair, links to anything else as NVSwitch links."""

import sys
import types

from nearlocal.probe.gpu import GpuDevice, GpuInfo, _probe_nvml, norm_bus_id

BUS = ["0000:1B:00.0", "0000:2C:00.0"]


def _fake_pynvml(remotes: dict[int, list[str]]):
    nvml = types.ModuleType("pynvml")
    nvml.NVML_NVLINK_MAX_LINKS = 4
    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetHandleByPciBusId = lambda bus: BUS.index(bus.decode())
    nvml.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 5
    nvml.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16
    nvml.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 5
    nvml.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16

    def state(handle, link):
        if link >= len(remotes[handle]):
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return 1

    nvml.nvmlDeviceGetNvLinkState = state
    nvml.nvmlDeviceGetNvLinkRemotePciInfo_v2 = lambda handle, link: types.SimpleNamespace(
        busId=remotes[handle][link].encode())
    return nvml


def test_nvlink_links_per_pair_and_pcie(monkeypatch):
    remotes = {0: ["00000000:2C:00.0", "00000000:2C:00.0", "00000000:99:00.0"],
               1: ["00000000:1B:00.0", "00000000:1B:00.0"]}
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(remotes))
    info = GpuInfo(devices=[GpuDevice(i, "Fake", 1 << 30, "9.0", pci_bus_id=BUS[i])
                            for i in range(2)])
    assert _probe_nvml(info) is None
    assert info.nvlink_links == [[0, 2], [2, 0]]
    assert info.devices[0].nvlink_active == 3 and info.devices[0].nvswitch_links == 1
    assert (info.devices[1].pcie_gen, info.devices[1].pcie_width) == (5, 16)


def test_bus_ids_compare_across_cuda_and_nvml_spellings():
    assert norm_bus_id("00000000:1B:00.0") == norm_bus_id("0000:1b:00.0")


def test_no_nvml_is_a_reason_not_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert "nvidia-ml-py is not importable" in _probe_nvml(GpuInfo())


def test_a_broken_nvrtc_is_named_in_one_line():
    from nearlocal.probe.gpu import _probe_nvrtc

    def broken():
        raise OSError("libnvrtc.so.13: cannot open shared object file:\nNo such file or directory")

    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
        nvrtc=types.SimpleNamespace(getVersion=broken)))
    info = GpuInfo()
    _probe_nvrtc(cupy, info)
    assert info.nvrtc.startswith("NVRTC is not usable through cupy (OSError: libnvrtc.so.13")
    assert "\n" not in info.nvrtc and "pip install 'cuda-toolkit[nvrtc]==" in info.nvrtc
    working = GpuInfo()
    cupy.cuda.nvrtc.getVersion = lambda: (13, 0)
    _probe_nvrtc(cupy, working)
    assert working.nvrtc is None and working.nvrtc_version == "13.0"


def test_a_gpu_without_cupy_is_told_which_extra_to_install(monkeypatch, tmp_path):
    """An NVIDIA driver is loaded but cupy is missing: the reason names the extra for the
    driver's CUDA (13 from driver 580 on, else 12)."""
    from nearlocal.probe.gpu import probe_gpu
    from nearlocal.sysroot import SysRoot

    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    version = tmp_path / "proc" / "driver" / "nvidia" / "version"
    version.parent.mkdir(parents=True)
    for driver, extra in (("580.65.06", "cuda13"), ("550.127.05", "cuda12")):
        version.write_text(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  Sun Jul 27 "
                           "06:54:38 UTC 2025\nGCC version:  gcc version 12.2.0\n")
        reason = probe_gpu(SysRoot(tmp_path)).reason
        assert reason.startswith("no GPU: cupy is not importable (")
        assert f"NVIDIA driver ({driver}) is loaded" in reason
        assert reason.endswith(f"pip install 'nearlocal[{extra}]'")
    version.unlink()
    assert probe_gpu(SysRoot(tmp_path)).reason.endswith(")")  # no driver: no advice


def test_a_cupy_the_driver_cannot_run_is_told_the_extra_for_the_driver(monkeypatch, tmp_path):
    from nearlocal.probe.gpu import probe_gpu
    from nearlocal.sysroot import SysRoot
    from tests.gpu_fakecupy import CUDARuntimeError, make_fake_cupy

    cp = make_fake_cupy()

    def insufficient():
        raise CUDARuntimeError(35)  # cudaErrorInsufficientDriver

    cp.cuda.runtime.getDeviceCount = insufficient
    monkeypatch.setitem(sys.modules, "cupy", cp)
    version = tmp_path / "proc" / "driver" / "nvidia" / "version"
    version.parent.mkdir(parents=True)
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue\n")
    reason = probe_gpu(SysRoot(tmp_path)).reason
    assert reason.startswith("no GPU: CUDA runtime unusable (CUDARuntimeError: status 35)")
    assert "cupy is built for CUDA 13 and the NVIDIA driver is 550.127.05" in reason
    assert reason.endswith("pip install 'nearlocal[cuda12]'")


def test_an_nvml_error_other_than_no_such_link_is_said(monkeypatch):
    """NVML answering a link with an error other than "no such link" (a GPU lost, no
    permission) may hide a real link: the probe says so instead of counting it absent."""
    remotes = {0: ["00000000:2C:00.0"], 1: ["00000000:1B:00.0"]}
    nvml = _fake_pynvml(remotes)
    answer = nvml.nvmlDeviceGetNvLinkState

    def state(handle, link):
        if handle == 1 and link == 0:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return answer(handle, link)

    nvml.nvmlDeviceGetNvLinkState = state
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    info = GpuInfo(devices=[GpuDevice(i, "Fake", 1 << 30, "9.0", pci_bus_id=BUS[i])
                            for i in range(2)])
    reason = _probe_nvml(info)
    assert reason is not None and "GPU 1 link 0: RuntimeError: NVML_ERROR_GPU_IS_LOST" in reason
    assert "counts may be short" in reason and info.nvlink_links == [[0, 1], [0, 0]]


def test_cuda_bindings_missing_and_broken_are_told_apart(monkeypatch, tmp_path):
    from nearlocal.probe.gpu import _missing_parts

    (tmp_path / "bindings").mkdir()  # installed, and its import fails: the cause is told
    (tmp_path / "bindings" / "__init__.py").write_text(
        "raise OSError('libnvJitLink.so.13: cannot open shared object file')\n")
    package = types.ModuleType("cuda")
    package.__path__ = [str(tmp_path)]
    monkeypatch.setitem(sys.modules, "cuda", package)
    monkeypatch.delitem(sys.modules, "cuda.bindings", raising=False)
    (broken,) = [part for part in _missing_parts(13, GpuInfo()) if "cuda-bindings" in part]
    assert broken.startswith("cuda-bindings does not import (OSError: libnvJitLink.so.13")
    monkeypatch.setitem(sys.modules, "cuda", None)  # not installed at all
    (missing,) = [part for part in _missing_parts(13, GpuInfo()) if "cuda-bindings" in part]
    assert missing.startswith("cuda-bindings (cuda-memcpy-batch api=bindings): pip install")
