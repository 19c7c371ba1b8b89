"""`movers=k` on the GPU methods a serving path's host->gpu / pool->gpu hop stands on (issue 57):
k CUDA streams, each the method's own session over its own slots, against the simulated GPU
(tests/gpu_fakecupy.py; the kernels run by the CPU shim). What is checked: every mover's calls go
to its own stream, into its own buffer, on its own GPU with devices=D; the row carries k, the
per-mover and aggregate figures and every mover's samples; bad parameters are exit-2 errors, D
beyond the box's GPUs a skip reason; the contention suite takes the rows by the parameter, and
the contention fit reads them as the hop's way."""

import dataclasses
import json
import shutil

import numpy as np
import pytest

from nearlocal.core.cases import Case
from nearlocal.core.methods import load_methods, methods_with_param
from nearlocal.core.sampling import StoppingRule
from nearlocal.engine.worker import WorkerSettings, measure
from nearlocal.errors import UsageError
from nearlocal.probe.gpu import GpuDevice, GpuInfo
from nearlocal.whatif.contention import contention_of

if shutil.which("g++") is None:
    pytest.skip("g++ runs the kernels' CUDA C on the CPU", allow_module_level=True)

SETTINGS = WorkerSettings(StoppingRule(budget_s=0.01, min_samples=3, max_samples=4), 1e9, False)
PATTERN = "6x40B@64B"  # 240 bytes a mover, spans 360 B


def _run(method: str, k: int, *extra: tuple[str, str], region: str = "pinned") -> dict:
    params = (("movers", str(k)), *extra)
    if method.endswith("kernel"):
        params += (("threads", "8"),)
    row, raw, ns, _ = measure(Case(method, region, "wb", PATTERN, peer="gpu:0", params=params),
                              SETTINGS, 0.0)
    assert row["n_samples"] == len(ns) == len(raw) >= 1 and np.all(ns >= 0)
    return row


def test_the_hops_methods_take_movers_and_devices():
    methods = load_methods()
    takers = methods_with_param("movers", marker="gpu")
    assert set(takers) == {"cuda-memcpy-async", "cuda-memcpy-batch", "gather-kernel"}
    for name in takers:
        assert methods[name].params["movers"] == "1" and methods[name].params["devices"] == "1"
        assert methods[name].delivery.mover == "gpu"


@pytest.mark.parametrize("method", ["cuda-memcpy-async", "cuda-memcpy-batch", "gather-kernel"])
def test_k_movers_give_per_mover_and_aggregate_figures(fake_cupy, batch_driver, method):
    row = _run(method, 3)
    info = row["info"]
    assert info["movers"] == 3 and info["mover_gpus"] == [0, 0, 0] and info["devices"] == 1
    assert info["bytes_per_mover"] == 240
    assert [m["stream"] for m in info["per_mover"]] == [0, 1, 2]
    assert all(m["median_ns"] >= 0 for m in info["per_mover"])
    kept = [len(s) for s in info["mover_samples_ns"]]  # warm-up's too, as the CPU movers'
    assert len(set(kept)) == 1 and kept[0] >= row["n_samples"]
    assert info["aggregate_gbps"] > 0 and info["span_median_ns"] > 0
    assert "one event pair spanning all k" in info["timed"] and row["clock"] == "cuda-event"
    assert info["timer_overhead_ns"] >= 0 and info["span_overhead_ns"] >= 0


def test_each_mover_copies_on_its_own_stream_into_its_own_slots(fake_cupy):
    runtime = fake_cupy.cuda.runtime
    seen: list[tuple[int, int, int]] = []
    real = runtime.memcpyAsync

    def memcpy_async(dst, src, n, kind, stream):
        seen.append((stream, dst, src))
        real(dst, src, n, kind, stream)

    runtime.memcpyAsync = memcpy_async
    row = _run("cuda-memcpy-async", 2, ("prime", "0"))
    assert row["info"]["primed"] is False
    copies = [(s, d, src) for s, d, src in seen]
    by_stream: dict[int, set] = {}
    for stream, dst, src in copies:
        by_stream.setdefault(stream, set()).add((dst, src))
    movers = [pairs for pairs in by_stream.values() if len(pairs) == 6]  # each its 6 fragments
    assert len(movers) == 2  # two streams, each always the same 6 copies
    (a, b) = movers
    assert not {d for d, _ in a} & {d for d, _ in b}  # no two movers write the same bytes
    assert not {s for _, s in a} & {s for _, s in b}  # nor read the same slots
    assert min(d for d, _ in b) - min(d for d, _ in a) in (4096, -4096)  # one slot apart


def test_movers_spread_over_devices_each_on_its_own_gpu(fake_cupy):
    fake_cupy.cuda.runtime.device_count = 2
    used = []
    real = fake_cupy.cuda.Device

    class Device(real):
        def __enter__(self):
            used.append(self.index)
            return self

    fake_cupy.cuda.Device = Device
    row = _run("gather-kernel", 4, ("devices", "2"))
    info = row["info"]
    assert info["mover_gpus"] == [0, 1, 0, 1] and info["devices"] == 2
    assert set(info["mapped"]["gpu"]) == {"0", "1"}
    assert {m["gpu"] for m in info["per_mover"]} == {0, 1}
    assert {0, 1} <= set(used)


def test_bad_mover_parameters_are_usage_errors():
    check = load_methods()["cuda-memcpy-async"].check_params
    for params, words in (({"movers": "0"}, "malformed movers"),
                          ({"movers": "2", "devices": "3"}, "devices=3 spreads"),
                          ({"movers": "2", "timing": "e2e"}, "timed on the device"),
                          ({"movers": "65"}, "at most 64"),
                          ({"movers": "2", "devices": "x"}, "malformed devices")):
        with pytest.raises(UsageError, match=words):
            check({"timing": "device", **params})
    check({"movers": "4", "devices": "2", "timing": "device"})


def test_pageable_memory_is_refused_for_movers(fake_cupy):
    with pytest.raises(UsageError, match="pageable"):
        _run("cuda-memcpy-async", 2, region="dram")


def test_devices_beyond_the_box_are_a_skip_reason():
    from nearlocal.probe import probe

    inventory = probe(calibrate=False, gpu=False)
    one = dataclasses.replace(inventory, gpu=GpuInfo(devices=[GpuDevice(0, "Fake", 1 << 30,
                                                                        "9.0")]))
    needs = load_methods()["gather-kernel"].case_needs
    assert needs({"movers": "4", "devices": "2"}, one) == "devices=2: this box has 1 GPU(s)"
    assert needs({"movers": "4", "devices": "1"}, one) is None


def test_the_contention_suite_takes_the_gpu_movers_by_their_parameter():
    from nearlocal.core.suites import suite_cases
    from nearlocal.gpu.suites import CONTENTION_MOVERS, CONTENTION_PATTERN
    from nearlocal.probe import probe

    inventory = probe(calibrate=False, gpu=False)
    two = dataclasses.replace(inventory, gpu=GpuInfo(devices=[
        GpuDevice(i, "Fake", 1 << 30, "9.0") for i in range(2)]))
    cases = [c for c in suite_cases("contention", two) if c.peer == "gpu:0"]
    assert {c.method for c in cases} == {"cuda-memcpy-async", "cuda-memcpy-batch",
                                         "gather-kernel"}
    pinned = [c for c in cases if c.region == "pinned" and c.method == "gather-kernel"]
    params = [dict(c.params) for c in pinned]
    assert [p.get("movers", "1") for p in params if "devices" not in p] == \
        [str(k) for k in CONTENTION_MOVERS]
    assert {p["movers"] for p in params if p.get("devices") == "2"} == {"2", "4", "8"}
    assert all(c.pattern == CONTENTION_PATTERN and c.access == "read" for c in cases)
    assert all(c.region == "pinned" or c.region.startswith("registered:") for c in cases)
    assert any(c.method == "memcpy" for c in suite_cases("contention", two))  # the CPU half


def test_the_contention_fit_reads_gpu_mover_rows_as_the_hops_way(fake_cupy, batch_driver):
    rows = []
    for k, extra in ((1, ()), (2, ()), (2, (("devices", "2"),))):
        if extra:
            fake_cupy.cuda.runtime.device_count = 2
        row = _run("cuda-memcpy-batch", k, *extra) if k > 1 else None
        if row is None:
            row, _, _, _ = measure(Case("cuda-memcpy-batch", "pinned", "wb", PATTERN,
                                         peer="gpu:0"), SETTINGS, 0.0)
        params = {"movers": str(k), **dict(extra)} if k > 1 else {}
        rows.append({**row, "case_id": f"batch/{k}/{len(extra)}", "method": "cuda-memcpy-batch",
                     "region": "pinned", "pattern": PATTERN, "params": json.dumps(params),
                     "status": "ok", "pool_class": "local", "peer_pool_class": "gpu",
                     "info": json.dumps(row["info"])})
    out = contention_of(rows)
    way = out["host->gpu/cuda-memcpy-batch"]
    assert sorted(way) == [1, 2]
    assert way[2]["aggregate_gbps"] == json.loads(rows[1]["info"])["aggregate_gbps"] > 0
    kept = json.loads(rows[1]["info"])["mover_samples_ns"]
    assert way[2]["service_ns"]["n"] == len(kept[0]) + len(kept[1])  # every mover's samples
    assert list(out["host->gpu/cuda-memcpy-batch over 2 devices"]) == [2]
