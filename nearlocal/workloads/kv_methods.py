"""The `kv` suite and the `kv-metadata` method: a KV read timed from decision to data-ready.

A read of KV-cache state has two phases, each a row with the same `kv:` pattern:
- metadata (method `kv-metadata`): the block table (and, for sparse reads, the chosen tokens) is in
  hand; the compiled builder turns it into the fragment table. Timed by fenced rdtscp inside numba.
- transfer: the CPU methods (load, clflushopt-load, memcpy gather pool -> local; nt-store, memcpy
  scatter local -> pool) on `dram` and `shm:nearlocal-kv`, and the GPU methods where a GPU exists.
Decision to data-ready = the metadata row + a transfer row of the same pattern. Fragment count and
size, contiguity and RDMA work requests are columns, so time can be plotted against them.
"""

from __future__ import annotations

import numpy as np

from nearlocal.core.cases import Case
from nearlocal.core.methods import METHODS, Method, SessionContext, methods_joining, register_method
from nearlocal.core.patterns import Pattern
from nearlocal.core.suites import Suite, extend_suite, register_suite
from nearlocal.errors import UsageError
from nearlocal.workloads import kv

POOL_REGIONS = ("dram", "shm:nearlocal-kv")
GATHER_METHODS = ("load", "clflushopt-load", "memcpy")  # pool -> local (access read)
SCATTER_METHODS = ("nt-store", "memcpy")  # local -> pool (access write)
GPU_GATHER = ("gather-kernel", "cuda-memcpy-async", "cuda-memcpy-batch")
GPU_SCATTER = ("scatter-kernel", "cuda-memcpy-async", "cuda-memcpy-batch")
GPU_POOLS, GPU_LOCAL = ("pinned", "registered:dram"), "gpu:0"  # pool on the host, read by GPU 0

# What the suite reads: one block per layout (B2's shape), superblocks vs scattered 16-token blocks
# (B3), sparse top-256 (B14), and the papers' quoted shapes. Sized to run on a small box: tp=8 or a
# few layers keep every pool region at or under ~32 MiB.
SUITE_PATTERNS = (
    "kv:qwen2.5-32b:flash-attn:dense",
    "kv:qwen2.5-32b:flashinfer:dense",
    "kv:qwen2.5-32b:cross-layer:dense",
    "kv:qwen2.5-32b:lmcache:dense:tp=8",
    "kv:deepseek-v3:mla:dense",
    "kv:qwen2.5-32b:flash-attn:superblock:tp=8",
    "kv:qwen2.5-32b:flash-attn:dense:16:blocks=scattered:tp=8",
    "kv:qwen2.5-32b:flash-attn:sparse:256:layers=0-3:ctx=1024",
    "kv:qwen2.5-32b:flash-attn:sparse:256:layers=0-3:ctx=1024:order=hnd:dist=clustered",
    "kv:128x20KiB",
    "kv:1024x160B",
)


def _check_pattern(pattern: Pattern) -> None:
    """Only a kv: pattern has a block table to turn into fragments: anything else is bad input,
    refused before the run (exit 2), not a failed row from the worker."""
    if not str(pattern.text).startswith("kv:") or kv.is_explicit(pattern.text):
        raise UsageError(f"kv-metadata needs a kv:MODEL... pattern with a block table, "
                         f"not {pattern.text!r}")


class MetadataSession:
    """Times the metadata phase of the case's kv: pattern. The block table and token choices are
    the decision's inputs (made before timing); the descriptors are per-model constants."""

    clock = "tsc"

    def __init__(self, ctx: SessionContext):
        _check_pattern(ctx.pattern)
        text = ctx.case.pattern
        from nearlocal.workloads import kernels  # numba: compiled here, not at registration

        self.ctx = ctx
        plan = kv.parse_plan(text)
        geometry = plan.geometry
        self.expected = ctx.pattern.count
        table = plan.table
        if plan.selection.kind == "sparse":
            desc = geometry.sparse(plan.layers)
            tokens = plan.tokens()
            pieces = desc.layer_offsets.size * tokens.shape[1] * tokens.shape[2]
            self.out = np.empty((pieces, 3), np.int64)
            self._args = (table, tokens, desc.layer_offsets, desc.tensors, desc.block_stride,
                          desc.token_stride, desc.head_stride, desc.unit, geometry.block_tokens,
                          self.out)
            self._kernel = kernels.time_sparse_metadata
        else:
            desc = geometry.dense(plan.layers)
            pieces = desc.outer.size * table.size
            self.out = np.empty((pieces, 3), np.int64)
            self._args = (table, desc.outer, desc.tensors, desc.block_stride, desc.piece,
                          desc.block_major, self.out)
            self._kernel = kernels.time_dense_metadata
        self.info = {"timer_overhead_ticks": ctx.timer_overhead_ticks, "phase": "metadata",
                     "pieces": pieces, "block_table_len": int(table.size)}

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        ticks = np.empty(n, np.uint64)
        made = self._kernel(*self._args, ticks)
        if made != self.expected:  # the timed code must build exactly the case's table
            raise RuntimeError(f"metadata built {made} fragments, the pattern has {self.expected}")
        ns = np.maximum(ticks.astype(np.float64) - self.ctx.timer_overhead_ticks, 0.0)
        return ticks, ns * 1e9 / self.ctx.tsc_hz

    def close(self) -> None:
        pass


register_method(Method(
    cacheable=False,
    name="kv-metadata", marker="cpu", accesses=("read",), state="-", moves_bytes=False,
    measures="operation",
    summary="decision -> fragment list: block table (and chosen tokens) to the merged fragment "
            "table of a kv: pattern, compiled, nothing moved",
    open_session=MetadataSession, cpu_flags=("rdtscp",), markers=("cpu",),
    check_pattern=_check_pattern,
))


def _gpu_cases(pattern: str) -> list[Case]:
    """GPU rows, only when the GPU methods and regions are declared (skipped rows without a GPU)."""
    from nearlocal.regions import REGION_KINDS, load_providers

    load_providers()
    kinds = {GPU_LOCAL.split(":")[0], *(pool.split(":")[0] for pool in GPU_POOLS)}
    if not kinds <= set(REGION_KINDS):
        return []
    cases = []
    for access, names in (("read", GPU_GATHER), ("write", GPU_SCATTER)):
        for name in names:
            method = METHODS.get(name)
            if method is not None and access in method.accesses:
                cases += [Case(name, pool, "wb", pattern, peer=GPU_LOCAL, access=access)
                          for pool in GPU_POOLS]
    return cases


def kv_cases(patterns: tuple[str, ...] = SUITE_PATTERNS,
             regions: tuple[str, ...] = POOL_REGIONS) -> list[Case]:
    """Metadata, gather and scatter rows for every pattern (GPU rows when declared)."""
    cases = []
    for pattern in patterns:
        if not kv.is_explicit(pattern):
            cases.append(Case("kv-metadata", "dram", "wb", pattern, access="read"))
        for region in regions:
            cases += [Case(m, region, "wb", pattern, access="read") for m in GATHER_METHODS]
            cases += [Case(m, region, "wb", pattern, access="write") for m in SCATTER_METHODS]
        cases += _gpu_cases(pattern)
    return cases


register_suite(Suite("kv", "KV-cache reads from real layouts: metadata, CPU gather / scatter on "
                     "dram and shm, GPU gather / scatter where a GPU exists", [kv_cases]))

# What `quick` gathers besides its sizes: a serving read's fragments out of local DRAM (Qwen2.5-32B
# flash-attn 16-token blocks, scattered: 128 pieces of 32 KiB a block), so the what-if's host-side
# gather has a many-fragment row to fit a per-fragment cost from (whatif/fit.py). A reload comes
# from memory, never from a CPU cache: the read spans at least 4x the box's LLC, the larger of
# cpuid's and the measured one (in a VM the host's LLC, which cpuid reports, still serves a guest
# read of twice the measured one: 18.5 GB/s at 16 MiB against 10.6 at 64 MiB on the dev VM).
QUICK_SERVING_MODEL = "qwen2.5-32b:flash-attn"
QUICK_SERVING_BLOCKS = (16, 256)  # a read of 64 MiB .. 1 GiB (4 MiB a block)
SERVING_BLOCK_BYTES = 4 << 20  # qwen2.5-32b, TP 1, bf16: 64 layers x K, V x 16 tokens x 4 KiB
UNKNOWN_LLC_BYTES = 64 << 20


def quick_serving_pattern(llc_bytes: int) -> str:
    """The serving read sized to the box: at least 4x its LLC (`llc_bytes`; 0 when unknown)."""
    low, high = QUICK_SERVING_BLOCKS
    blocks = -(-4 * (llc_bytes or UNKNOWN_LLC_BYTES) // SERVING_BLOCK_BYTES)
    return f"kv:{QUICK_SERVING_MODEL}:dense:{min(high, max(low, blocks))}:blocks=scattered"


def quick_serving_cases(inventory) -> list[Case]:
    """Every quick method that lands a read's bytes in the peer (Method.delivery), on dram."""
    cpu = inventory.cpu
    pattern = quick_serving_pattern(max(cpu.llc_bytes, cpu.cpuid_llc_bytes))
    return [Case(name, "dram", "wb", pattern, access="read")
            for name in methods_joining("quick")
            if METHODS[name].delivery is not None and "read" in METHODS[name].accesses]


extend_suite("quick", quick_serving_cases)


# The contention suite: the host gather (memcpy; and load, reads that land nothing, to show how
# reads alone share memory) of a serving read, k = 1, 2, 4, ... concurrent movers up to the CPUs
# this process may use, on local DRAM and on each pool region of the box. The read is quick's
# serving read (above), at least 4x the LLC (a reload comes from memory); every mover moves one.
CONTENTION_METHODS = ("memcpy", "load")


def contention_cases(inventory) -> list[Case]:
    """movers = k rows of the serving read on dram and the box's pool regions."""
    import os

    from nearlocal.cpu.movers import mover_counts
    from nearlocal.cpu.pool import pool_regions

    cpu = inventory.cpu
    pattern = quick_serving_pattern(max(cpu.llc_bytes, cpu.cpuid_llc_bytes))
    ks = mover_counts(len(os.sched_getaffinity(0)))
    return [Case(method, region, "wb", pattern, access="read",
                 params=(("movers", str(k)),) if k > 1 else ())
            for region in ("dram", *pool_regions(inventory))
            for method in CONTENTION_METHODS for k in ks]


# joinable: the GPU's host->gpu / pool->gpu movers (k CUDA streams) join it from gpu/suites.py,
# the RDMA read by k queue pairs from rdma/methods.py
register_suite(Suite("contention", "k concurrent movers (movers=k), each gathering its own "
                     "serving read (over 4x the LLC) from its own slots: per-mover and aggregate "
                     "bandwidth and service times at k = 1, 2, 4, ...; other ways of moving "
                     "bytes join it (k CUDA streams, k queue pairs)", [contention_cases],
                     joinable=True))
