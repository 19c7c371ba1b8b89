"""Beluga B10 on a CPU box: the GPU's copies and gather kernel from uncached and write-combining
host memory, against the cupy test double (tests/gpu_fakecupy.py). A write-combined `pinned`
region is cudaHostAlloc'd with cudaHostAllocWriteCombined; a uc / wc (or wb) mapping through the
nearlocal_pool module (`ncmem:`, uc / wc on `devdax:`; tests/fakesys.py's fake module and
device) is registered with cudaHostRegisterIoMemory, and where CUDA refuses that the case is a
skipped row with CUDA's own error. Nothing here is a measurement; the kernels run on the CPU
shim."""

from __future__ import annotations

import shutil

import pytest

from nearlocal.core.cases import Case, unavailable, validate
from nearlocal.core.sampling import StoppingRule
from nearlocal.engine.worker import WorkerSettings, measure
from nearlocal.errors import Unavailable, UsageError
from nearlocal.gpu.regions import HOST_ALLOC_FLAGS, HOST_REGISTER_FLAGS, WC_PINNED_MEMTYPE
from nearlocal.probe.poolmod import DEVICE, WINDOWS
from nearlocal.regions import attribute_unavailable, parse_region
from tests.fakesys import pool_module_box, write

if shutil.which("g++") is None:
    pytest.skip("g++ runs the kernels' CUDA C on the CPU", allow_module_level=True)

SETTINGS = WorkerSettings(StoppingRule(budget_s=0.01, min_samples=3, max_samples=4), 1e9, False)
SMALL = (("threads", "8"),)
START = 0x1080000000
PAT = "/sys/kernel/debug/x86/pat_memtype_list"
NCMEM = f"registered:ncmem:{DEVICE}"
B10_METHODS = ("cuda-memcpy", "cuda-memcpy-batch", "gather-kernel")


@pytest.fixture
def module_box(tmp_path, monkeypatch):
    """The nearlocal_pool module bound to 16 MiB at START, its PAT list giving `types[attr]`
    when a test writes it (the fake device is a plain file; its type windows at offset 0)."""
    root = pool_module_box(tmp_path, START)
    write(root, "/sys/bus/dax/devices/dax0.0/resource", hex(START))
    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(root))
    monkeypatch.setattr("nearlocal.regions.devices.WINDOWS", dict.fromkeys(WINDOWS, 0))
    return root


PAT_TYPES = {"uc": "uncached", "wc": "write-combining", "wb": "write-back"}


def _pat(root, attr: str) -> None:
    write(root, PAT, f"PAT: [mem 0x{START:016x}-0x{START + (16 << 20):016x}] {PAT_TYPES[attr]}")


def _params(method: str) -> tuple:
    return SMALL if method.endswith("kernel") else ()


def _flags(table: dict[str, int], *names: str) -> int:
    value = 0
    for name in names:
        value |= table[name]
    return value


@pytest.mark.parametrize("method", B10_METHODS)
@pytest.mark.parametrize("size", ["16KiB", "64KiB"])
def test_wc_pinned_region_is_allocated_write_combined(fake_cupy, batch_driver, method, size):
    """`pinned --attr wc`: cudaHostAlloc(portable | mapped | write-combined); the row says CUDA
    allocated it so and that no PAT type was read back for it."""
    runtime = fake_cupy.cuda.runtime
    row, _, ns, _ = measure(Case(method, "pinned", "wc", size, peer="gpu:0",
                                 params=_params(method)), SETTINGS, 0.0)
    info = row["info"]
    assert len(ns) >= 1 and info["src_memory"] == "pinned"
    assert info["host_alloc_flags"] == "portable|mapped|write-combined"
    assert info["memtype"] == WC_PINNED_MEMTYPE and info["memtype"].startswith("unknown: ")
    wc = _flags(HOST_ALLOC_FLAGS, "portable", "mapped", "write-combined")
    assert wc == 0x07 and wc in runtime.alloc_flags.values()
    assert runtime.host_allocs == {}  # freed on close


def test_wb_pinned_region_is_allocated_as_before(fake_cupy):
    runtime = fake_cupy.cuda.runtime
    row, _, _, _ = measure(Case("cuda-memcpy", "pinned", "wb", "16KiB", peer="gpu:0"),
                           SETTINGS, 0.0)
    assert row["info"]["host_alloc_flags"] == "portable|mapped" and "memtype" not in row["info"]
    assert set(runtime.alloc_flags.values()) == {0x03}  # the region; no kernel staging here


@pytest.mark.parametrize("method", B10_METHODS)
@pytest.mark.parametrize("attr", ["uc", "wc", "wb"])
def test_module_mappings_are_registered_as_io_memory(fake_cupy, batch_driver, module_box,
                                                     method, attr):
    """registered:ncmem:... is cudaHostRegister'd portable | mapped | io-memory (read-only: it is
    mapped read-only without --allow-write); the row says what was registered, with which
    flags, and keeps the PAT type the kernel mapped."""
    _pat(module_box, attr)
    runtime = fake_cupy.cuda.runtime
    row, _, ns, _ = measure(Case(method, NCMEM, attr, "16KiB", peer="gpu:0",
                                 params=_params(method)), SETTINGS, 0.0)
    info = row["info"]
    assert len(ns) >= 1 and info["src_memory"] == "registered"
    assert info["registered"] == f"ncmem:{DEVICE}" and info["via"] == DEVICE
    assert info["register_flags"] == "portable|mapped|io-memory|read-only"
    flags = _flags(HOST_REGISTER_FLAGS, "portable", "mapped", "io-memory", "read-only")
    assert info["register_flags_value"] == "0x0f" and set(runtime.register_flags.values()) == {flags}
    assert info["memtype"] == PAT_TYPES[attr]  # what the kernel mapped, read back
    assert runtime.registered == {}  # unregistered on close


def test_a_writable_module_mapping_is_registered_without_read_only(fake_cupy, module_box):
    _pat(module_box, "wc")
    settings = WorkerSettings(SETTINGS.rule, 1e9, True)  # --allow-write: mapped read-write
    row, _, _, _ = measure(Case("cuda-memcpy", NCMEM, "wc", "16KiB", peer="gpu:0"), settings, 0.0)
    assert row["info"]["register_flags"] == "portable|mapped|io-memory"
    assert set(fake_cupy.cuda.runtime.register_flags.values()) == {0x07}


def test_devdax_through_the_module_is_registered_as_io_memory(fake_cupy, module_box):
    _pat(module_box, "uc")
    row, _, _, _ = measure(Case("gather-kernel", "registered:devdax:/dev/dax0.0@2MiB,2MiB", "uc",
                                "16KiB", peer="gpu:0", params=SMALL), SETTINGS, 0.0)
    info = row["info"]
    assert info["via"] == DEVICE and info["device"] == "/dev/dax0.0"
    assert "io-memory" in info["register_flags"] and info["memtype"] == "uncached"


def test_ram_is_registered_without_io_memory(fake_cupy):
    row, _, _, _ = measure(Case("cuda-memcpy", "registered:dram", "wb", "16KiB", peer="gpu:0"),
                           SETTINGS, 0.0)
    assert row["info"]["register_flags"] == "portable|mapped"
    assert set(fake_cupy.cuda.runtime.register_flags.values()) == {0x03}


@pytest.mark.parametrize("attr", ["uc", "wc"])
def test_a_refused_io_memory_registration_is_a_skip_in_cudas_words(fake_cupy, module_box, attr):
    _pat(module_box, attr)
    runtime = fake_cupy.cuda.runtime
    runtime.refuse_io_memory = True
    with pytest.raises(Unavailable) as caught:
        measure(Case("cuda-memcpy", NCMEM, attr, "16KiB", peer="gpu:0"), SETTINGS, 0.0)
    reason = str(caught.value)
    assert "cudaErrorNotSupported: operation not supported" in reason  # CUDA's own words
    assert f"ncmem:{DEVICE} ({attr}" in reason and "io-memory" in reason and "\n" not in reason
    assert runtime.registered == {} and runtime.calls.get("memcpy", 0) == 0  # nothing moved


def test_a_refused_ram_registration_still_fails_the_case(fake_cupy):
    fake_cupy.cuda.runtime.fail_register = True
    with pytest.raises(RuntimeError, match="cudaErrorInvalidValue: invalid argument; not falling"):
        measure(Case("cuda-memcpy", "registered:dram", "wb", "16KiB", peer="gpu:0"), SETTINGS, 0.0)


def test_the_worker_replies_skipped_and_the_runner_keeps_it_skipped(fake_cupy, module_box,
                                                                    monkeypatch):
    """errors.Unavailable from a case's open: the worker answers ("skipped", CUDA's words), and
    the runner makes a skipped row of it with them, never a failed one."""
    from nearlocal.engine import runner, worker
    from nearlocal.engine.workers import MeasuringWorker
    from nearlocal.kernels.timer import ClockCalibration

    settings = WorkerSettings(SETTINGS.rule, 1e9, False, clock=ClockCalibration(0.0, 1.0))
    _pat(module_box, "uc")
    fake_cupy.cuda.runtime.refuse_io_memory = True
    case = Case("cuda-memcpy", NCMEM, "uc", "16KiB", peer="gpu:0")

    class Conn:
        def __init__(self, messages):
            self.messages, self.sent = list(messages), []

        def recv(self):
            return self.messages.pop(0)

        def send(self, message):
            self.sent.append(message)

    conn = Conn([("measure", case, None), None])
    worker._serve(conn, settings)
    reply = conn.sent[-1]
    assert reply[0] == "skipped" and "cudaErrorNotSupported: operation not supported" in reply[1], reply

    monkeypatch.setattr(MeasuringWorker, "ask", lambda self, case, message: reply)
    run = runner.Runner(None, settings, None)
    row, _raw, ns, _ = run._measure(case)
    assert row["status"] == "skipped" and row["reason"] == reply[1] and ns is None


def test_registered_takes_the_attributes_its_inner_region_offers(module_box):
    for text in (NCMEM, "registered:devdax:/dev/dax0.0"):
        spec = parse_region(text)
        for attr in ("uc", "wc"):
            assert attribute_unavailable(spec, attr) is None, (text, attr)
    dram = parse_region("registered:dram")
    assert attribute_unavailable(dram, "wb") is None
    assert "uncacheable" in attribute_unavailable(dram, "uc")  # dram offers only wb
    pinned = parse_region("pinned")
    assert attribute_unavailable(pinned, "wc") is None
    assert "uncacheable" in attribute_unavailable(pinned, "uc")  # CUDA allocates no uc memory


def test_b10_cases_validate_and_are_skipped_without_a_gpu(module_box):
    from nearlocal.probe import probe

    inventory = probe(calibrate=False, gpu=False)
    for method in B10_METHODS:
        for region, attr in (("pinned", "wc"), (NCMEM, "uc"), (NCMEM, "wc")):
            case = Case(method, region, attr, "16KiB", peer="gpu:0", params=_params(method))
            validate(case, inventory)
            assert unavailable(case, inventory, False).startswith("no GPU")
    with pytest.raises(UsageError, match="unknown attribute"):
        validate(Case("cuda-memcpy", "pinned", "wt", "16KiB", peer="gpu:0"), inventory)
