"""The GPU suites: `gpu` (Beluga's GPU half: cudaMemcpy per fragment vs one kernel, B9-B11, B14)
and `swiftcache` (NVLink peer copies and the layer stream, S2-S3). On a box without GPUs every
case is a skipped row with its reason. `gpu_cases` / `swiftcache_cases` are public so other suites
(a `beluga` suite, say) can take them in with `extend_suite`."""

from __future__ import annotations

from nearlocal.core.cases import Case
from nearlocal.core.suites import Suite, register_suite

# Beluga: sparse KV read (1024 x 160 B, B14), a dense block's 128 ~20 KB pieces (B2), 64 KiB (B11)
GPU_PATTERNS = ("1024x160B", "128x20KiB", "64KiB")
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
                     "kernel, batched and 2-D copies, zero-copy (Beluga B9-B11, B14)",
                     [gpu_cases]))
register_suite(Suite("swiftcache", "GPU <-> GPU over NVLink: peer copies and kernels, the "
                     "layer stream (SwiftCache S2-S3)", [swiftcache_cases]))
