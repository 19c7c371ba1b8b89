"""The papers' end-to-end claims recomputed from path models (the report's "Serving claims"
section, `nearlocal whatif --claims`): for each of B3, B11, B16 and S1-S3, what the paper
reports, what its own microbenchmarks predict through the same model (the reference box of its
paper: beluga-h20 holds B1, B11 and B12, swiftcache-media S2), and what
this box's rows predict. The gap between the first two is what the paths do not explain
(queueing, the serving stack); what path rows cannot recompute at all is said in one line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nearlocal.units import format_ns
from nearlocal.whatif.claim_figures import (
    B3_TTFT_S,
    B16_ADAPTERS,
    B16_QPS,
    B16_REQUEST,
    B16_TTFT_S,
    S1_REDUCTION,
    Claim,
)
from nearlocal.whatif.references import load_reference
from nearlocal.whatif.serving import (
    NOT_MEASURED,
    PathFigures,
    Request,
    WhatifInputs,
    best_way,
    shape_of,
    whatif,
)

GIB = 1 << 30
KIB64 = 64 * 1024

def paper_inputs(reference: str) -> WhatifInputs:
    """A paper's microbenchmarks (its reference box) as the inputs of a what-if."""
    links = load_reference(reference).links
    return WhatifInputs({hop: list(models) for hop, models in links.items()}, reference)


def _by_name(result) -> dict[str, PathFigures]:
    return {p.path: p for p in result.paths}


def _rows(*paths: PathFigures | None) -> tuple[str, ...]:
    return tuple(dict.fromkeys(r for p in paths if p for t in p.terms for r in t.rows
                               if t.source == "measured"))


def _missing(path: PathFigures) -> str:
    return "; ".join(f"{t.hop} {t.source}" for t in path.terms if t.ns is None) or NOT_MEASURED


@dataclass(frozen=True)
class _Single:
    ns: float | None
    rows: tuple[str, ...] = ()
    outside: bool = False  # the size lies outside the measured ones (the model's note says so)

    def text(self, scale: float = 1.0) -> str:
        if self.ns is None:
            return NOT_MEASURED
        return format_ns(self.ns * scale) + (" (extrapolated)" if self.outside else "")


def _single(inputs: WhatifInputs, hop: str, size: int) -> _Single:
    """One contiguous transfer of `size` over `hop`: the fastest measured way."""
    found = best_way(inputs.measured.get(hop) or [], 1, size)
    if found is None:
        return _Single(None)
    _, best = found
    return _Single(best.ns, best.rows, best.outside)


def claim_b11(box: WhatifInputs, papers: WhatifInputs) -> Claim:
    values = {}
    texts = []
    rows: tuple[str, ...] = ()
    for who, inputs in (("papers", papers), ("box", box)):
        pool, local = _single(inputs, "pool->gpu", KIB64), _single(inputs, "host->gpu", KIB64)
        values[who] = {"pool_ns": pool.ns, "local_ns": local.ns,
                       "ratio": pool.ns / local.ns if pool.ns and local.ns else None}
        if who == "box":
            rows = (*pool.rows, *local.rows)
        if pool.ns is not None and local.ns is not None:
            texts.append(f"{pool.text()} vs {local.text()} ({pool.ns / local.ns:.2f}x)")
        else:
            texts.append(f"pool->gpu {pool.text()}; host->gpu {local.text()}")
    return Claim("B11", "64 KB pool -> GPU copy vs from local host DRAM",
                 '11.73 us vs 10.32 us ("near-local"; 1.14x computed here)', texts[0], texts[1],
                 "the per-call cost a fitted from local DRAM's 64 KB copy holds for the pool",
                 "a single copy: the path model is the whole figure", values, rows)


def claim_b3(box: WhatifInputs, papers: WhatifInputs) -> Claim:
    values = {}
    texts = []
    rows: tuple[str, ...] = ()
    reported = B3_TTFT_S[1] / B3_TTFT_S[0]
    for who, inputs in (("papers", papers), ("box", box)):
        blocks = _by_name(whatif(inputs, B16_REQUEST))["rdma"]
        supers = _by_name(whatif(inputs, Request(model=B16_REQUEST.model,
                                                 context=B16_REQUEST.context,
                                                 select="superblock")))["rdma"]
        if blocks.complete and supers.complete:
            ratio = blocks.reload_ns / supers.reload_ns
            values[who] = {"blocks_ns": blocks.reload_ns, "superblocks_ns": supers.reload_ns,
                           "ratio": ratio}
            texts.append(f"{format_ns(blocks.reload_ns)} vs {format_ns(supers.reload_ns)} "
                         f"({ratio:.2f}x)")
            if who == "box":
                rows = _rows(blocks, supers)
        else:
            values[who] = None
            texts.append(_missing(blocks))
    papers_ratio = (values["papers"] or {}).get("ratio")
    explains = ("path rows cannot recompute Mooncake's queueing near saturation and its "
                "per-block bookkeeping; the reload itself")
    if papers_ratio:
        explains += (f" explains {papers_ratio:.2f}x of the reported {reported:.2f}x")
    return Claim("B3", "Mooncake cache-hit TTFT: 16-token blocks vs 256-token superblocks "
                 "(reload per request over the RDMA path)",
                 f"{B3_TTFT_S[1]} s vs {B3_TTFT_S[0]} s ({reported:.2f}x computed here)",
                 texts[0], texts[1],
                 f"{B16_REQUEST.model}, {B16_REQUEST.context} tokens, flash-attn, TP 1 (the paper "
                 "names Qwen-32B and >15K-token inputs); RDMA into host DRAM, then over PCIe",
                 explains, values, rows)


def claim_b16(box: WhatifInputs, papers: WhatifInputs) -> Claim:
    shape_bytes = shape_of(B16_REQUEST).total_bytes
    needed = [qps * shape_bytes / 1e9 for qps in B16_QPS]
    values: dict = {"bytes_per_request": shape_bytes, "needed_gbps": needed,
                    "adapters_assumed": B16_ADAPTERS}
    texts = []
    rows: tuple[str, ...] = ()
    for who, inputs in (("papers", papers), ("box", box)):
        paths = _by_name(whatif(inputs, B16_REQUEST))
        pool, rdma = paths["cxl-pool"], paths["rdma"]
        parts = []
        figures = {}
        for label, path in (("pool", pool), ("RDMA", rdma)):
            if path.complete:
                figures[label] = path
                parts.append(f"{label} {format_ns(path.reload_ns)}/request, "
                             f"{path.requests_per_s:.3g} req/s per link")
            else:
                parts.append(f"{label}: {_missing(path)}")
        if len(figures) == 2:
            parts.append(f"reload {rdma.reload_ns / pool.reload_ns:.2f}x faster over the pool")
        values[who] = {k: {"reload_ns": p.reload_ns, "requests_per_s": p.requests_per_s}
                       for k, p in figures.items()}
        if who == "papers" and "pool" in figures:
            bound = figures["pool"].requests_per_s * B16_ADAPTERS
            values["papers"]["pool_bound_qps"] = bound
            parts.append(f"{B16_ADAPTERS} adapters: {bound:.3g} req/s "
                         f"({'enough' if bound >= B16_QPS[1] else 'not enough'} for "
                         f"{B16_QPS[1]} QPS)")
        if who == "box":
            rows = _rows(pool, rdma)
        texts.append("; ".join(parts))
    return Claim("B16", "end to end, all-hit run vs Mooncake: TTFT and throughput",
                 f"TTFT {B16_TTFT_S[0]} s -> {B16_TTFT_S[1]} s; {B16_QPS[0]} -> {B16_QPS[1]} QPS",
                 texts[0], texts[1],
                 f"{B16_REQUEST.model}, {B16_REQUEST.context} tokens, bf16, TP 1: "
                 f"{shape_bytes / 1e9:.2f} GB per request; {B16_QPS[1]} QPS needs "
                 f"{needed[1]:.1f} GB/s of reload, {B16_QPS[0]} QPS {needed[0]:.1f} GB/s; the "
                 f"paper gives 26 GB/s per adapter but no adapter count: {B16_ADAPTERS} assumed "
                 "(one per socket, two servers)",
                 "TTFT holds prefill of the uncached part, queueing and decode interference, "
                 "which path rows do not: only the reload's share and the throughput bound are "
                 "recomputed", values, rows)


def required_reload_share(reduction: float, bandwidth_ratio: float) -> float:
    """S1 as a property: a TTFT reduction `reduction` from a faster reload medium (old / new
    reload time `bandwidth_ratio` = b) needs the reload to be at least r / (1 - b) of the
    baseline TTFT (the rest of TTFT unchanged)."""
    return reduction / (1.0 - bandwidth_ratio)


def claim_s1(box: WhatifInputs, papers: WhatifInputs) -> Claim:
    values = {}
    texts = []
    rows: tuple[str, ...] = ()
    for who, inputs in (("papers", papers), ("box", box)):
        paths = _by_name(whatif(inputs, B16_REQUEST))
        pcie, nvlink = paths["cpu-offload"], paths["nvlink"]
        if pcie.complete and nvlink.complete:
            b = nvlink.reload_ns / pcie.reload_ns
            share = required_reload_share(S1_REDUCTION, b)
            values[who] = {"b": b, "required_share": share}
            texts.append(f"reload over NVLink {b:.3f} of PCIe's: -69% needs the reload to be "
                         f">= {share:.1%} of TTFT")
            if who == "box":
                rows = _rows(pcie, nvlink)
        else:
            values[who] = None
            texts.append("; ".join(_missing(p) for p in (pcie, nvlink) if not p.complete))
    return Claim("S1", "P99 TTFT with KV parked on a peer GPU instead of host DRAM",
                 "up to -69% P99 TTFT; up to 3.98x maximum context length", texts[0], texts[1],
                 "only the reload changes between the two setups",
                 "the 3.98x context gain needs the co-located models' HBM budgets, not path "
                 "rows: not recomputed", values, rows)


def claim_s2(box: WhatifInputs, papers: WhatifInputs) -> Claim:
    media = (("PCIe", "host->gpu"), ("NVMe", "nvme->gpu"), ("NVLink", "gpu-peer"))
    values = {}
    texts = []
    rows: list[str] = []
    for who, inputs in (("papers", papers), ("box", box)):
        found = {name: _single(inputs, hop, GIB) for name, hop in media}
        got = {name: single.ns for name, single in found.items()}
        if who == "box":
            rows += [r for single in found.values() for r in single.rows]
        values[who] = dict(got)
        parts = [f"{name} {single.text()}" for name, single in found.items()]
        if got["NVLink"] and got["PCIe"]:
            values[who]["nvlink_over_pcie"] = got["PCIe"] / got["NVLink"]
            parts.append(f"NVLink {got['PCIe'] / got['NVLink']:.1f}x PCIe")
        if got["NVLink"] and got["NVMe"]:
            values[who]["nvlink_over_nvme"] = got["NVMe"] / got["NVLink"]
            parts.append(f"{got['NVMe'] / got['NVLink']:.1f}x NVMe")
        texts.append("; ".join(parts))
    return Claim("S2", "reload of 1 GiB per medium", "CPU offload over PCIe ~16 GB/s; NVMe SSD "
                 "~7 GB/s; NVLink ~600 GB/s (~37x PCIe, SSD ~85x slower than NVLink)",
                 texts[0], texts[1],
                 "one contiguous 1 GiB transfer per medium",
                 "a bandwidth claim: the path model is the whole figure", values,
                 tuple(dict.fromkeys(rows)))


def claim_s3(box: WhatifInputs, papers: WhatifInputs) -> Claim:
    layer = shape_of(B16_REQUEST)
    layer_bytes = layer.total_bytes // layer.layers
    values = {"layer_bytes": layer_bytes}
    texts = []
    rows: tuple[str, ...] = ()
    for who, inputs in (("papers", papers), ("box", box)):
        single = _single(inputs, "gpu-peer", layer_bytes)
        ns = single.ns
        values[who] = None if ns is None else 2 * ns
        texts.append(NOT_MEASURED + ": gpu-peer" if ns is None else
                     f"{single.text(2)} per layer (fetch and write back), "
                     f"{format_ns(2 * ns * layer.layers)} per pass of {layer.layers} layers")
        if who == "box":
            rows = single.rows
    return Claim("S3", "Layer Stream Cache: a layer's KV fetched from the peer GPU and written "
                 "back", "no figure (the paper describes the mechanism)", texts[0], texts[1],
                 f"{B16_REQUEST.model} at {B16_REQUEST.context} tokens: "
                 f"{layer_bytes / 2**20:.0f} MiB per layer (the paper names no model)",
                 "whether it hides behind a layer's compute depends on that compute time: "
                 "`nearlocal whatif --layer-compute-us` gives the pipelined figure", values, rows)


# each claim and the reference box holding its paper's microbenchmarks
CLAIMS: tuple[tuple[Callable[[WhatifInputs, WhatifInputs], Claim], str], ...] = (
    (claim_b3, "beluga-h20"), (claim_b11, "beluga-h20"), (claim_b16, "beluga-h20"),
    (claim_s1, "swiftcache-media"), (claim_s2, "swiftcache-media"),
    (claim_s3, "swiftcache-media"))


def claims(box: WhatifInputs, samples=None, trace=None, load: bool = True,
           prefill: tuple[float, ...] | None = None) -> list[Claim]:
    """Every claim: the per-request ones, then (`load`) the load claims of `load_claims` (B3
    and B16 under a Poisson stream, S1 and S4 over `trace`: the shipped conversation trace
    when None and present; absent, those two say what is missing). `samples`: the run's raw
    samples, the spread each measured reload is drawn from; `prefill`: the user's prefill rate(s)
    in tokens/s per GPU, shown instead of the load claims' grid."""
    papers = {name: paper_inputs(name) for name in ("beluga-h20", "swiftcache-media")}
    found = [build(box, papers[name]) for build, name in CLAIMS]
    if load:
        from nearlocal.whatif.load_claims import load_claims, shipped_trace

        found += load_claims(box, papers, samples,
                             trace if trace is not None else shipped_trace(), prefill)
    return found
