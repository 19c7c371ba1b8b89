"""The GPU suites: `gpu` (Beluga's GPU half: cudaMemcpy per fragment vs one kernel, B9-B11, B14;
and the shapes serving moves: qwen2.5-32b's flash-attn and cross-layer blocks, a 64 MiB layer)
and `swiftcache` (NVLink peer copies and the layer stream, S2-S3). On a box without GPUs every
case is a skipped row with its reason. `gpu_cases` / `swiftcache_cases` are public so other suites
(a `beluga` suite, say) can take them in as parts."""

from __future__ import annotations

from nearlocal.core.cases import Case
from nearlocal.core.suites import Suite, extend_suite, register_suite

# Beluga: sparse KV read (1024 x 160 B, B14), a dense block's 128 20 KB pieces (B2), 64 KiB (B11)
GPU_PATTERNS = ("1024x160B", "128x20KiB", "64KiB")
# What serving moves, cut from the shipped qwen2.5-32b (64 layers, 8 KV heads x 128, bf16, TP 1,
# 16-token blocks: 4096 B a token a layer) so a GPU box's rows feed a reload-time model without
# extrapolation. Figures from `nearlocal kv --model qwen2.5-32b --layout L --select dense:4
# --blocks scattered`:
SERVING_PATTERNS = (
    # vLLM's flash-attn blocks, per-layer pieces: 512 fragments of 32 KiB (one block's K or V in
    # one layer), none adjacent, 16 MiB in all; the region (the pool) spans 32 MiB
    "kv:qwen2.5-32b:flash-attn:dense:4:blocks=scattered",
    # vLLM's cross-layer layout (a block holds every layer): 4 fragments of 4 MiB, 16 MiB in all;
    # the region spans 28 MiB
    "kv:qwen2.5-32b:cross-layer:dense:4:blocks=scattered",
    # a whole layer in one transfer: K+V of one layer at 16K tokens (16384 x 8 x 128 x 2 B x 2),
    # and the bandwidth end of the single-transfer ladder whose other end is 64 KiB
    "64MiB",
)
MAPPED_HOST = ("pinned", "registered:dram")
API_METHODS = ("cuda-memcpy", "cuda-memcpy-async", "cuda-memcpy-batch", "cuda-memcpy-2d")
PEER_PATTERNS = ("64KiB", "2MiB", "64MiB", "128x20KiB")


def gpu_cases() -> list[Case]:
    cases = []
    for region in MAPPED_HOST:
        for pattern in GPU_PATTERNS:
            for method in API_METHODS:
                cases.append(Case(method, region, "wb", pattern, peer="gpu:0"))
            cases.append(Case("gather-kernel", region, "wb", pattern, peer="gpu:0"))
            cases.append(Case("scatter-kernel", region, "wb", pattern, peer="gpu:0"))
            cases.append(Case("zero-copy-kernel", region, "wb", pattern, peer="gpu:0"))
            for method in ("cuda-memcpy-async", "gather-kernel"):
                cases.append(Case(method, region, "wb", pattern, peer="gpu:0",
                                  params=(("timing", "e2e"),)))
    for pattern in GPU_PATTERNS:  # pageable local DRAM, the baseline of B11
        for method in ("cuda-memcpy", "cuda-memcpy-async"):
            cases.append(Case(method, "dram", "wb", pattern, peer="gpu:0"))
    # serving's shapes on mapped host memory, device timing only (zero-copy and e2e rows stay on
    # the papers' shapes); after the papers' cases, whose ids and order are unchanged
    for region in MAPPED_HOST:
        for pattern in SERVING_PATTERNS:
            for method in API_METHODS:
                if method == "cuda-memcpy-2d" and pattern.startswith("kv:"):
                    continue  # needs equal fragments at a constant stride: scattered blocks are not
                cases.append(Case(method, region, "wb", pattern, peer="gpu:0"))
            cases.append(Case("gather-kernel", region, "wb", pattern, peer="gpu:0"))
            cases.append(Case("scatter-kernel", region, "wb", pattern, peer="gpu:0"))
    return cases


def swiftcache_cases() -> list[Case]:
    cases = []
    for access in ("read", "write"):
        for pattern in PEER_PATTERNS:
            for method in ("peer-memcpy", "peer-kernel"):
                cases.append(Case(method, "gpu:1", "wb", pattern, peer="gpu:0", access=access))
    for pattern in ("2MiB", "64MiB"):  # S2: the PCIe path the peer GPU replaces
        for method in ("cuda-memcpy", "cuda-memcpy-async"):
            cases.append(Case(method, "pinned", "wb", pattern, peer="gpu:0"))
    for compute_us in ("50", "200"):
        for copy in ("memcpy", "kernel"):
            cases.append(Case("layer-stream", "gpu:1", "wb", "4MiB", peer="gpu:0",
                              params=(("layers", "32"), ("compute_us", compute_us),
                                      ("copy", copy))))
    return cases


register_suite(Suite("gpu", "host <-> GPU: cudaMemcpy per fragment vs one gather / scatter "
                     "kernel, batched and 2-D copies, zero-copy (Beluga B9-B11, B14); serving's "
                     "qwen2.5-32b blocks and a 64 MiB layer",
                     [gpu_cases]))
# joinable: S2's reload from an SSD joins it from storage/methods.py
register_suite(Suite("swiftcache", "GPU <-> GPU over NVLink: peer copies and kernels, the "
                     "layer stream (SwiftCache S2-S3)", [swiftcache_cases], joinable=True))


# The contention suite's GPU half (issue 57): the hops host->gpu (pinned local memory) and
# pool->gpu (each pool region of the box registered with cudaHostRegister) under k concurrent
# movers, each a CUDA stream moving its own copy of serving's per-layer blocks (512 x 32 KiB,
# 16 MiB a mover); where the box has several GPUs, the same with the movers spread over all of
# them (devices=N, k >= N). The methods are those that take `movers` (gpu/methods.py's
# `movers=True`: what the hops stand on), found by the parameter, not named here.
CONTENTION_PATTERN = SERVING_PATTERNS[0]
CONTENTION_MOVERS = (1, 2, 4, 8)


def gpu_contention_cases(inventory) -> list[Case]:
    from nearlocal.core.methods import METHODS, methods_with_param
    from nearlocal.cpu.pool import pool_regions

    regions = ("pinned", *(f"registered:{pool}" for pool in pool_regions(inventory)))
    gpus = len(inventory.gpu.devices)
    spreads = [(k, 1) for k in CONTENTION_MOVERS]
    if gpus > 1:
        spreads += [(k, gpus) for k in sorted({gpus, *CONTENTION_MOVERS}) if k >= gpus]
    cases = []
    for region in regions:
        for name in methods_with_param("movers", marker="gpu"):
            if "read" not in METHODS[name].accesses:
                continue
            for k, devices in spreads:
                params = ((("movers", str(k)),) if k > 1 else ()) + \
                    ((("devices", str(devices)),) if devices > 1 else ())
                cases.append(Case(name, region, "wb", CONTENTION_PATTERN, peer="gpu:0",
                                  access="read", params=params))
    return cases


extend_suite("contention", gpu_contention_cases)
