"""Synthetic runs for the report tests: hand-made rows written through the real Store."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from nearlocal.store.writer import Store
from nearlocal.units import format_size

INVENTORY = {
    "hostname": "box-a", "kernel": "6.8.0", "host_id": "abc123",
    "cpu": {"model": "Test CPU", "vendor": "GenuineIntel", "logical_cpus": 8,
            "flags": {"clflush": True, "movdir64b": True, "avx512f": False},
            "caches": [{"level": 3, "kind": "Unified", "size_bytes": 32 * 2**20}]},
    "tsc_hz": 2.0e9, "tsc_source": "cpuid",
    "numa": [{"node": 0, "cpus": [0, 1], "mem_total_bytes": 2**34},
             {"node": 1, "cpus": [], "mem_total_bytes": 2**36}],
    "cxl": {"present": True, "memdevs": [{}], "regions": [{}]},
    "dax": [{"name": "dax0.0", "size": 2**36, "mode": "devdax"}],
    "dsa": {"module_loaded": True, "devices": [{"name": "dsa0"}]},
    "gpu": {"devices": [{"index": 0, "name": "H20"}]},
    "hugepages": {"pools": [{"page_bytes": 2**21, "total": 8, "free": 8}], "thp_mode": "madvise"},
}


def row(method: str, region: str = "dram", *, attr: str = "wb", size: int = 16384,
        access: str = "read", peer: str = "dram", median: float | None = 1000.0,
        status: str = "ok", reason: str = "", params: dict | None = None,
        marker: str = "cpu", fragments: int = 1, pattern: str | None = None,
        converged: bool = True, reaches_memory: bool | None = None,
        llc_resident: bool | None = None) -> dict:
    """One case row as the runner writes it (median in ns; p10 / p90 at -10% / +20%); the
    cache facts only where given (None: a row stored before rows carried them)."""
    params = params or {}
    fragment_bytes = size // fragments
    pattern = pattern or (format_size(size) if fragments == 1
                          else f"{fragments}x{format_size(fragment_bytes)}")
    case_id = "/".join([method, region, attr, pattern, access, f"peer={peer}",
                        *(f"{k}={v}" for k, v in sorted(params.items()))])
    data = {
        "case_id": case_id, "suite": "test", "method": method, "marker": marker,
        "region": region, "region_kind": region.split(":")[0], "attr": attr, "pattern": pattern,
        "peer": peer, "access": access, "params": json.dumps(params, sort_keys=True),
        "state": "warm", "status": status, "reason": reason, "size_bytes": size,
        "fragment_count": fragments, "fragment_bytes": fragment_bytes, "bytes_moved": size,
    }
    for name, fact in (("reaches_memory", reaches_memory), ("llc_resident", llc_resident)):
        if fact is not None:
            data[name] = fact
    if status == "ok":
        data.update(n_samples=100, converged=converged, min_ns=median * 0.8, median_ns=median,
                    mean_ns=median, p10_ns=median * 0.9, p90_ns=median * 1.2,
                    p99_ns=median * 1.5, max_ns=median * 2, stddev_ns=median * 0.1,
                    mad_ns=median * 0.05, ci_low_ns=median * 0.99,
                    ci_high_ns=median * (1.3 if not converged else 1.01),
                    gbps=size / median, clock="tsc", elapsed_s=0.1)
    return data


def make_run(root: Path, rows: list[dict], inventory: dict | None = None,
             run_id: str | None = None, meta: dict | None = None) -> Path:
    inventory = inventory or INVENTORY
    store = Store.create(root, {"suite": "test", "inventory": inventory,
                                "host_id": inventory.get("host_id"),
                                "settings": {"budget_s": 0.1, "target_rel_ci": 0.01},
                                **(meta or {})}, run_id=run_id)
    for data in rows:
        if data["status"] == "ok":
            ns = np.full(5, data["median_ns"])
            store.add_case(data, ns * 2, ns)
        else:
            store.add_case(data)
    return store.finish()


UC_REASON = "no provider on this box can map uncacheable memory"


def full_rows(scale: float = 1.0) -> list[dict]:
    """A pool box with DSA, a GPU, RPC, KV, layer-stream and one failure."""
    pool = "devdax:/dev/dax0.0"
    rows = [
        # B7 at 16 KiB: the pool row must win over dram
        row("nt-store", pool, access="write", median=4820 * scale),
        row("nt-store", "dram", access="write", median=1000 * scale),
        row("store", pool, attr="uc", access="write", status="skipped", reason=UC_REASON),
        row("clflush-load", pool, median=5980 * scale),
        row("load", pool, attr="uc", status="failed", reason="worker crashed: SIGBUS"),
        row("dsa-memmove", pool, access="write", median=1905 * scale, marker="dsa"),
        row("dsa-memmove", pool, access="read", median=2000 * scale, marker="dsa"),
        # near-local: numa:1 (CPU-less) vs dram, same pattern
        row("load", "numa:1", size=65536, median=3000 * scale),
        row("load", "dram", size=65536, median=1500 * scale),
        # RPC
        row("rpc-roundtrip", "shm:rpc", pattern="rpc:128x64B", size=8192, fragments=128,
            access="write", median=2110 * scale),  # protocol=flush, the default: not stored
        row("rpc-throughput", "shm:rpc", pattern="rpc:128x64B", size=8192, fragments=128,
            access="write", median=250 * scale, params={"protocol": "coherent", "qd": "128"}),
        # KV fragments and a fragment-count series
        row("load", "shm:kv", size=1024 * 160, fragments=1024, median=50000 * scale),
        row("load", "shm:kv", size=256 * 160, fragments=256, median=14000 * scale),
        row("load", "shm:kv", size=1024 * 160, fragments=1024, median=40000 * scale,
            params={"qd": "16"}),
        row("kv-metadata", "dram", pattern="kv:qwen2.5-32b:flash-attn:dense", size=2**20,
            fragments=128, median=800 * scale),
        row("memcpy", "shm:kv", pattern="kv:qwen2.5-32b:flash-attn:dense", size=2**20,
            fragments=128, median=90000 * scale),
        # GPU: pool -> GPU and pinned -> GPU at 64 KiB, a gather kernel over fragments
        row("cuda-memcpy", pool, size=65536, peer="gpu:0", median=11730 * scale, marker="gpu"),
        row("cuda-memcpy", "pinned", size=65536, peer="gpu:0", median=10320 * scale,
            marker="gpu"),
        row("cuda-memcpy", pool, size=1024 * 160, fragments=1024, peer="gpu:0",
            median=900000 * scale, marker="gpu"),
        row("gather-kernel", pool, size=1024 * 160, fragments=1024, peer="gpu:0",
            median=30000 * scale, marker="gpu"),
        row("cuda-memcpy", pool, attr="uc", size=16384, peer="gpu:0", median=1230000 * scale,
            marker="gpu"),
        row("peer-memcpy", "gpu:1", size=2**26, peer="gpu:0", median=2**26 / 450 * scale,
            marker="gpu"),
        row("layer-stream", "gpu:1", size=2**20, peer="gpu:0", median=5000 * scale,
            marker="gpu", params={"layers": "4"}),
        # an unconverged case
        row("memcpy", "dram", size=2**26, median=4e6 * scale, converged=False),
        # idle latency: local dram and the CPU-less node at the headline ring sizes
        row("chase", "dram", size=16384, median=1.5 * scale),
        row("chase", "numa:1", size=16384, median=1.6 * scale),
        row("chase", "dram", size=2**30, median=280.0 * scale),
        row("chase", "numa:1", size=2**30, median=560.0 * scale),
    ]
    # B8: CPU (nt-store) faster below 8 KiB, DSA faster from 8 KiB up
    for size, cpu, dsa in ((1024, 100, 900), (4096, 400, 1000), (8192, 1500, 1200),
                           (65536, 9000, 4000)):
        rows.append(row("nt-store", pool, size=size, access="write", median=cpu * scale))
        rows.append(row("dsa-memmove", pool, size=size, access="write", median=dsa * scale,
                        marker="dsa"))
    return rows


def cpu_only_rows() -> list[dict]:
    """What `nearlocal run` gives on a plain box: CPU methods on dram, uc skipped, no DSA/GPU."""
    rows = []
    for size in (64, 4096, 16384, 65536):
        rows.append(row("load", size=size, median=size / 50))
        rows.append(row("nt-store", size=size, access="write", median=size / 20))
        rows.append(row("clflush-load", size=size, median=size / 5))
    rows.append(row("store", attr="uc", access="write", status="skipped", reason=UC_REASON))
    rows.append(row("dsa-memmove", access="write", status="skipped", marker="dsa",
                    reason="no DSA work queue: the idxd driver is not loaded"))
    return rows


CPU_ONLY_INVENTORY = {**INVENTORY, "numa": [{"node": 0, "cpus": [0, 1],
                                             "mem_total_bytes": 2**33}],
                      "cxl": {"present": False}, "dax": [], "dsa": {"module_loaded": False},
                      "gpu": {"devices": [], "reason": "no GPU"}}
