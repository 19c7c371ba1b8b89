"""GPU methods: the CUDA runtime's copy APIs (one call per fragment, batched, 2-D), one CUDA C
kernel (NVRTC called directly, no headers) for the whole fragment table (Beluga B9, B13-B14),
zero-copy access to mapped host memory, NVLink peer copies and SwiftCache's layer stream
(S2-S3). This module registers them; the sessions live in `copy_sessions`, `kernel_sessions` and
`layerstream` (what they share, and how both clocks work: `session`), why one cannot run in
`needs`.

Host<->GPU methods: the region under test is the host side (pinned, registered:..., dram), the
peer is gpu:K (the GPU doing the work); read = region -> GPU (gather), write = GPU -> region
(scatter). Peer methods: region gpu:J (the donor), peer gpu:K (the local GPU doing the work).
"""

from __future__ import annotations

from nearlocal.core.methods import Delivery, Method, register_method
from nearlocal.gpu.copy_sessions import BatchSession, Memcpy2DSession, MemcpySession, PeerMemcpySession
from nearlocal.gpu.kernel_sessions import KernelSession, PeerKernelSession, ZeroCopySession
from nearlocal.gpu.layerstream import LayerStreamSession
from nearlocal.gpu.movers import with_gpu_movers
from nearlocal.gpu.needs import needs_batch, needs_gpu, needs_peer, needs_two
from nearlocal.gpu.session import check_params

# --- registration ---------------------------------------------------------------------------

_TIMING = {"timing": "device"}
_COPY = {**_TIMING, "prime": "1"}  # prime=0: no 1-byte copy before the start event
_KERNEL = {**_TIMING, "width": "16", "threads": "128", "group": "0"}


def _gpu(name: str, summary: str, accesses: tuple[str, ...], open_session, needs,
         params: dict, regions=("host", "gpu"), markers=("gpu",), sample_bytes=None,
         calls: str | None = "one", movers: bool = False) -> Method:
    """calls: how many calls a read of n fragments costs (core.methods.CALL_RULES); None: the
    method lands no read's bytes in the other side's memory (a zero-copy sum, the layer stream).
    movers: it takes `movers=k` (and `devices=D`): k concurrent streams, each moving its own
    copy of the pattern (gpu/movers.py); the contention suite picks such methods by that
    parameter (gpu/suites.py), the contention fit by the rows' k."""
    method = Method(
        cacheable=False,
        name=name, marker="gpu", summary=summary, accesses=accesses, state="-",
        open_session=open_session, region_spaces=frozenset(regions),
        peer_spaces=frozenset({"gpu"}), needs=needs, params=params, markers=markers,
        check_params=check_params, sample_bytes=sample_bytes,
        delivery=Delivery("gpu", calls) if calls else None,
    )
    return register_method(with_gpu_movers(method) if movers else method)


_gpu("cuda-memcpy", "cudaMemcpy per fragment (synchronous; device time includes host gaps)",
     ("read", "write"), lambda ctx: MemcpySession(ctx, "cuda-memcpy", False), needs_gpu,
     _TIMING, calls="per-fragment")
_gpu("cuda-memcpy-async", "cudaMemcpyAsync per fragment on one stream",
     ("read", "write"), lambda ctx: MemcpySession(ctx, "cuda-memcpy-async", True), needs_gpu,
     _COPY, calls="per-fragment", movers=True)
_gpu("cuda-memcpy-batch", "cudaMemcpyBatchAsync: every fragment in one call (CUDA >= 12.8)",
     ("read", "write"), lambda ctx: BatchSession(ctx, "cuda-memcpy-batch"), needs_batch,
     {**_COPY, "api": "driver"}, movers=True)
_gpu("cuda-memcpy-2d", "cudaMemcpy2DAsync of regularly strided fragments",
     ("read", "write"), lambda ctx: Memcpy2DSession(ctx, "cuda-memcpy-2d"), needs_gpu, _COPY)
_gpu("gather-kernel", "one CUDA C kernel gathers every fragment into the GPU (reads mapped host "
     "memory; work split by bytes)",
     ("read",), lambda ctx: KernelSession(ctx, "gather-kernel"), needs_gpu, _KERNEL,
     movers=True)
_gpu("scatter-kernel", "one kernel scatters every fragment from the GPU into the region",
     ("write",), lambda ctx: KernelSession(ctx, "scatter-kernel"), needs_gpu, _KERNEL)
_gpu("zero-copy-kernel", "a kernel reads (byte sums) or writes (fill) mapped host memory in place",
     ("read", "write"), lambda ctx: ZeroCopySession(ctx, "zero-copy-kernel"), needs_gpu,
     {**_KERNEL, "fill": "90"}, regions=("host",), calls=None)
_gpu("peer-memcpy", "cudaMemcpyPeerAsync per fragment between two GPUs (NVLink when peered)",
     ("read", "write"), lambda ctx: PeerMemcpySession(ctx, "peer-memcpy"), needs_two,
     _COPY, regions=("gpu",), markers=("gpu", "nvlink"), calls="per-fragment")
_gpu("peer-kernel", "one kernel on the local GPU copies every fragment from / to a peer GPU",
     ("read", "write"), lambda ctx: PeerKernelSession(ctx, "peer-kernel"), needs_peer,
     _KERNEL, regions=("gpu",), markers=("gpu", "nvlink"))
_gpu("layer-stream", "SwiftCache layer stream: per layer fetch from the peer GPU, compute, "
     "write back", ("read",), lambda ctx: LayerStreamSession(ctx, "layer-stream"), needs_peer,
     {**_TIMING, "layers": "32", "compute_us": "100", "copy": "memcpy", "width": "16",
      "threads": "128"},
     regions=("gpu",), markers=("gpu", "nvlink"),
     sample_bytes=lambda pattern: 2 * pattern.total_bytes,  # a layer's fetch and write-back
     calls=None)  # its figure is a layer's round trip, not a read's delivery

from nearlocal.gpu import suites  # noqa: E402, F401 - the gpu / swiftcache suites
