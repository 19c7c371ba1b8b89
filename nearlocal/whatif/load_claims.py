"""The papers' load claims recomputed as far as paths allow (issue 57 item 4): B3's block sizes
and B16's throughput under a seeded Poisson stream, S1's P99 TTFT over the conversation trace
with the reload's measured tail, and S4's Elastic Cache reclaim (a peer GPU's lent HBM taken
back in the middle of the trace, its blocks migrated to host DRAM or dropped and recomputed).

Built on `load`'s public pieces only (`path_service`, `simulate`, `fifo`, `serve`, `Setup`,
`trace_workload`): the per-request reload is the same figure as `nearlocal whatif`'s. Every
input the papers do not give (link counts, prefill rate, lent capacity, the load of B3) is a
named assumption, and where the figure depends on it the claim shows it over a small grid of
that input instead of picking one."""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

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
from nearlocal.whatif.load import Setup, fifo, path_service, serve, simulate, trace_workload
from nearlocal.whatif.references import ReferenceBox, load_reference
from nearlocal.whatif.serving import WhatifInputs, shape_of
from nearlocal.whatif.traffic import SHIPPED_TRACE, TRACE_BLOCK_TOKENS, Contexts, Trace, poisson, prefix_hits

# the shipped conversation trace (nearlocal/data/traces); absent, the trace claims say so
TRACE = SHIPPED_TRACE
STREAM_REQUESTS = 20000  # a Poisson stream's length; its P99 rests on 200 requests
SEED = 0
LINK_GRID = (1, 2, 4, 8, 16)  # links (NICs, adapters) the papers do not give
PREFILL_GRID = (20000.0, 80000.0)  # tokens/s per GPU: no paper gives one
SERVER_GPUS = 8  # SwiftCache's setting: one NVLink server (8 GPUs assumed)
LENT_GIB = (64, 512)  # the donors' lent HBM: the paper gives none
RECLAIM_SHARE = 0.5  # S4: one step of the donor's reclaim takes back half of what it lent
S4_WINDOW_S = 300.0  # the requests arriving in the 5 minutes after the reclaim
SUPERBLOCK = dataclasses.replace(B16_REQUEST, select="superblock")


def _s(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "diverges"
    return format_ns(seconds * 1e9)


def _stream(qps: float, requests: int = STREAM_REQUESTS) -> np.ndarray:
    """A seeded Poisson stream's arrival times at `qps` (B16's fixed 16K contexts)."""
    return poisson(qps, requests, Contexts("fixed", B16_REQUEST.context), SEED).unit_arrivals / qps


def _transfers(service, n: int, tokens: int) -> np.ndarray:
    """n transfers of `tokens` each: the model's figure times a seeded draw from the rows'
    spread (the reference boxes have none: the median)."""
    base = float(service.reload_s(np.array([tokens]))[0])
    if service.spread is None:
        return np.full(n, base)
    return base * np.random.default_rng(SEED).choice(service.spread, n)


def _mean_ttft(arrival: np.ndarray, transfer: np.ndarray, links: int) -> tuple[float, float]:
    timeline = simulate(arrival, transfer, None, links=links, gpus_per_link=1, sharing="fifo")
    ttft = timeline.ttft
    return float(ttft.mean()), float(np.percentile(ttft, 99))


def _provenance(*services) -> tuple[str, ...]:
    """The box's own rows behind the services (a reference's label is not a row)."""
    return tuple(dict.fromkeys(r for s in services if s is not None for r in s.rows
                               if not r.startswith("reference ")))


def _prefill(rate: float | None) -> str:
    return "reload alone" if rate is None else f"{rate:g} tok/s"


def _prefill_words(prefill: tuple[float, ...] | None) -> str:
    if prefill:
        return f"prefill per GPU given: {', '.join(f'{r:g}' for r in prefill)} tokens/s"
    return ("prefill per GPU not given: shown at "
            f"{', '.join(f'{r:g}' for r in PREFILL_GRID)} tokens/s")


def _signed(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + format_ns(abs(seconds) * 1e9)


def _box_only(box: WhatifInputs, paths: tuple[str, ...], compute) -> dict:
    missing = _unmeasured(box, paths)
    return {"missing": f"not measured on this box: {missing}"} if missing else compute()


def _unmeasured(inputs: WhatifInputs, paths: tuple[str, ...]) -> str:
    """Why the box stands for none of `paths` on its own ("" when one is measured): then a
    reference filling every hop would only repeat the papers' column."""
    one = np.array([B16_REQUEST.context])
    missing = []
    for name in paths:
        service = path_service(name, B16_REQUEST, inputs, one)
        if not service.missing:
            return ""
        missing.append(f"{name} {service.missing}")
    return "; ".join(missing)


# ---------------------------------------------------------------------------------------------
# B3: the utilisation each block size implies at the paper's load, and the queueing it gives


def _b3(inputs: WhatifInputs, samples=None) -> dict | None:
    one = np.array([B16_REQUEST.context])
    blocks = path_service("rdma", B16_REQUEST, inputs, one, samples=samples)
    supers = path_service("rdma", SUPERBLOCK, inputs, one, samples=samples)
    if blocks.missing or supers.missing:
        return {"missing": blocks.missing or supers.missing}
    qps = B16_QPS[0]
    arrival = _stream(qps)
    t_blocks = _transfers(blocks, len(arrival), B16_REQUEST.context)
    t_supers = _transfers(supers, len(arrival), B16_REQUEST.context)
    table = []
    for links in LINK_GRID:
        row = {"links": links}
        for label, work in (("blocks", t_blocks), ("superblocks", t_supers)):
            rho = qps * float(work.mean()) / links
            mean, p99 = _mean_ttft(arrival, work, links)
            row[label] = {"utilisation": rho, "mean_ttft_s": mean if rho < 1 else None,
                          "p99_ttft_s": p99 if rho < 1 else None,
                          "simulated_mean_s": mean}
        table.append(row)
    # the utilisation at which the superblocks' mean TTFT (reload alone) reaches 13.0 s
    unit = _stream(1.0)
    s_work = _transfers(supers, len(unit), B16_REQUEST.context)
    b_work = _transfers(blocks, len(unit), B16_REQUEST.context)
    mean_s = float(s_work.mean())

    def mean_at(rho: float, work: np.ndarray) -> float:
        return _mean_ttft(unit * mean_s / rho, work, 1)[0]

    low, high = 0.01, 0.9999
    if mean_at(high, s_work) < B3_TTFT_S[0]:
        rho_star = None
    else:
        for _ in range(50):
            middle = (low + high) / 2
            low, high = (middle, high) if mean_at(middle, s_work) < B3_TTFT_S[0] else (low, middle)
        rho_star = (low + high) / 2
    ratio = float(b_work.mean()) / mean_s
    found = {"qps": qps, "blocks_s": float(t_blocks.mean()), "superblocks_s": mean_s,
             "reload_ratio": ratio, "by_links": table, "rows": _provenance(blocks, supers),
             "requests": len(arrival)}
    if rho_star is not None:
        rho_b = rho_star * ratio
        found.update(superblock_utilisation_for_13s=rho_star, blocks_utilisation_then=rho_b,
                     blocks_mean_ttft_then_s=mean_at(rho_star, b_work) if rho_b < 1 else None,
                     blocks_mean_ttft_run_s=mean_at(rho_star, b_work))
    return found


def claim_b3_load(box: WhatifInputs, papers: WhatifInputs, samples=None, trace=None, prefill=None) -> Claim:
    """B3 under load; the reload alone (all hit), so no trace and no prefill rate."""
    values = {"papers": _b3(papers), "box": _b3(box, samples)}
    texts = []
    for who in ("papers", "box"):
        found = values[who]
        if "missing" in found:
            texts.append(f"rdma {found['missing']}")
            continue
        parts = []
        for row in found["by_links"]:
            b, s = row["blocks"], row["superblocks"]
            parts.append(f"{row['links']} link(s): utilisation {b['utilisation']:.2f} vs "
                         f"{s['utilisation']:.2f}, mean TTFT {_s(b['mean_ttft_s'])} vs "
                         f"{_s(s['mean_ttft_s'])}")
        text = (f"at {found['qps']} QPS (reload {_s(found['blocks_s'])} vs "
                f"{_s(found['superblocks_s'])}): " + "; ".join(parts))
        if "superblock_utilisation_for_13s" in found:
            rho, rho_b = found["superblock_utilisation_for_13s"], found["blocks_utilisation_then"]
            text += (f". Superblocks' mean TTFT is {B3_TTFT_S[0]} s at utilisation {rho:.3f}; "
                     f"blocks are then at {rho_b:.3f}")
            text += (f", mean TTFT {_s(found['blocks_mean_ttft_then_s'])}" if rho_b < 1 else
                     f" (past saturation: the queue grows for as long as the run lasts, "
                     f"{_s(found['blocks_mean_ttft_run_s'])} over {found['requests']} "
                     "requests)")
        texts.append(text)
    papers = values["papers"]
    explains = ("a FIFO of reloads alone (no prefill, decode or bookkeeping): near saturation "
                "the reload's 1.07x becomes any TTFT ratio, so the queueing can explain 5.91x "
                "only at one utilisation, and the paper gives neither its load nor its links")
    if "superblock_utilisation_for_13s" in papers:
        rho_b = papers["blocks_utilisation_then"]
        explains += (f"; with the paper's RDMA figures 13.0 s needs utilisation "
                     f"{papers['superblock_utilisation_for_13s']:.3f}, where 16-token blocks run "
                     f"at {rho_b:.3f}: "
                     + ("past saturation, so 76.8 s is a growing queue's figure (it depends on "
                        "the run's length), not a steady state" if rho_b >= 1 else
                        "a steady state"))
    return Claim("B3 load", "B3 under load: each block size's utilisation of the RDMA links at "
                 "Mooncake's load, and the queueing it gives",
                 f"{B3_TTFT_S[1]} s vs {B3_TTFT_S[0]} s", texts[0], texts[1],
                 f"the paper gives B3's load nowhere: B16's Mooncake throughput {B16_QPS[0]} QPS "
                 f"taken as it; a seeded Poisson stream ({STREAM_REQUESTS} requests, seed {SEED}) "
                 f"of {B16_REQUEST.model} at {B16_REQUEST.context} tokens, all cached; the RDMA "
                 f"path's reload alone, one at a time per link, requests to links in turn; links "
                 f"not given: shown over {', '.join(map(str, LINK_GRID))}; mean TTFT (the paper's "
                 "statistic is not said); none where utilisation >= 1",
                 explains, values, tuple((values["box"] or {}).get("rows", ())))


# ---------------------------------------------------------------------------------------------
# B16: the load at which each path's P99 TTFT diverges, beside 1.54 and 11.32 QPS


def _b16(inputs: WhatifInputs, samples=None) -> dict:
    one = np.array([B16_REQUEST.context])
    found: dict = {}
    for name in ("cxl-pool", "rdma"):
        service = path_service(name, B16_REQUEST, inputs, one, samples=samples)
        if service.missing:
            found[name] = {"missing": service.missing}
            continue
        mean = float(_transfers(service, STREAM_REQUESTS, B16_REQUEST.context).mean())
        at = {}
        for qps in B16_QPS:
            arrival = _stream(qps)
            work = _transfers(service, len(arrival), B16_REQUEST.context)
            diverges = qps * mean / B16_ADAPTERS >= 1
            at[str(qps)] = None if diverges else _mean_ttft(arrival, work, B16_ADAPTERS)[1]
        found[name] = {"reload_s": mean, "diverges_qps_per_link": 1 / mean,
                       "diverges_qps": B16_ADAPTERS / mean, "p99_ttft_s": at,
                       "rows": service.rows}
    return found


def claim_b16_load(box: WhatifInputs, papers: WhatifInputs, samples=None, trace=None, prefill=None) -> Claim:
    """B16 under load; the paper's all-hit run, so the reload alone: no prefill rate."""
    values = {"papers": _b16(papers), "box": _b16(box, samples), "links": B16_ADAPTERS}
    texts = []
    for who in ("papers", "box"):
        parts = []
        for name, found in values[who].items():
            if "missing" in found:
                parts.append(f"{name}: {found['missing']}")
                continue
            p99 = ", ".join(f"{_s(v)} at {k} QPS" for k, v in found["p99_ttft_s"].items())
            parts.append(f"{name} P99 diverges at {found['diverges_qps']:.3g} QPS "
                         f"({found['diverges_qps_per_link']:.3g} per link); P99 TTFT {p99}")
        texts.append("; ".join(parts))
    papers = values["papers"]
    explains = ("the reload's queue alone: ")
    pool, rdma = papers.get("cxl-pool", {}), papers.get("rdma", {})
    if "diverges_qps" in pool and "diverges_qps" in rdma:
        explains += (f"with the paper's figures the pool's links diverge at "
                     f"{pool['diverges_qps']:.3g} QPS, past {B16_QPS[1]}, so Beluga's "
                     f"throughput is not bound by its links; RDMA's diverge at "
                     f"{rdma['diverges_qps']:.3g} QPS, "
                     + (f"below Mooncake's {B16_QPS[0]}: the reload alone caps it"
                        if rdma["diverges_qps"] < B16_QPS[0] else
                        f"past Mooncake's {B16_QPS[0]}: the reload alone does not cap it"))
    explains += (f". The reported TTFTs ({B16_TTFT_S[0]} s, {B16_TTFT_S[1]} s) hold prefill, "
                 "decode interference and scheduling, which the reload's queue does not")
    return Claim("B16 load", "B16 under load: where each path's P99 TTFT diverges",
                 f"{B16_QPS[0]} -> {B16_QPS[1]} QPS; TTFT {B16_TTFT_S[0]} s -> {B16_TTFT_S[1]} s",
                 texts[0], texts[1],
                 f"a seeded Poisson stream ({STREAM_REQUESTS} requests) of {B16_REQUEST.model} at "
                 f"{B16_REQUEST.context} tokens, all hit (the paper's all-hit run); "
                 f"{B16_ADAPTERS} links per path (adapters or NICs: the paper gives neither "
                 "count); P99 diverges where the links are always busy (links / mean reload); "
                 "the reload alone, FIFO per link",
                 explains, values,
                 tuple(r for f in values["box"].values() for r in f.get("rows", ())))


# ---------------------------------------------------------------------------------------------
# S1: P99 TTFT over the conversation trace, PCIe vs NVLink, with the reload's measured tail


def _s1(inputs: WhatifInputs, trace: Trace, reference: ReferenceBox | None, samples=None,
        prefill: tuple[float, ...] = PREFILL_GRID) -> dict:
    work = trace_workload(trace, prefix_hits(trace))
    found: dict = {"by_prefill": []}
    for rate in (*prefill, None):
        setup = Setup(links=SERVER_GPUS, gpus_per_link=1, prefill_tokens_per_s=rate,
                      paths=("cpu-offload", "nvlink"), seed=SEED)
        result = serve(inputs, work, setup, B16_REQUEST, reference=reference, samples=samples)
        by = {p.path: p for p in result.paths}
        pcie, nvlink = by["cpu-offload"], by["nvlink"]
        if not (pcie.complete and nvlink.complete):
            return {"missing": "; ".join(p.missing for p in (pcie, nvlink) if p.missing)}
        found["by_prefill"].append({
            "prefill_tokens_per_s": rate, "pcie_p99_s": pcie.ttft.p99,
            "nvlink_p99_s": nvlink.ttft.p99, "reduction": 1 - nvlink.ttft.p99 / pcie.ttft.p99,
            "pcie_transfer_p99_s": pcie.transfer.p99, "pcie_wait_p99_s": pcie.reload_wait.p99})
        found.update(rows=tuple(r for r in dict.fromkeys((*pcie.rows, *nvlink.rows))
                                if not r.startswith("reference ")),
                     ways=tuple(dict.fromkeys((*pcie.ways, *nvlink.ways))),
                     tail_rows=pcie.spread_rows, hit_token_share=result.hit_token_share)
    return found


def _over_trace(box: WhatifInputs, papers: WhatifInputs, trace: Trace | None, paths: tuple[str, ...],
                text, compute, samples) -> tuple[dict, list[str]]:
    """A trace claim's values and its two texts (the papers' boxes, this box): `compute(inputs,
    reference, samples)` on each where the trace is there, `text(found)` for each that has its
    hops, the reference-filled ways named; both say the trace is missing where it is not."""
    if trace is None:
        return ({"papers": None, "box": None, "missing": f"the trace ({TRACE})"},
                [f"needs the conversation trace: {TRACE} absent"] * 2)
    reference = load_reference("swiftcache-media")
    values = {"papers": compute(papers, None, None),
              "box": _box_only(box, paths, lambda: compute(box, reference, samples))}
    texts = []
    for who in ("papers", "box"):
        found = values[who]
        if "missing" in found:
            texts.append(found["missing"])
            continue
        filled = [w for w in found["ways"] if "reference" in w]
        texts.append(text(found) + (f"; {'; '.join(filled)}" if filled else ""))
    return values, texts


def claim_s1_load(box: WhatifInputs, papers: WhatifInputs, samples=None, trace: Trace | None = None,
                  prefill: tuple[float, ...] | None = None) -> Claim:
    rates = prefill or PREFILL_GRID

    def text(found: dict) -> str:
        parts = [f"{_prefill(r['prefill_tokens_per_s'])}: {_s(r['pcie_p99_s'])} -> "
                 f"{_s(r['nvlink_p99_s'])} ({-r['reduction']:+.0%})" for r in found["by_prefill"]]
        tail = (f"; PCIe's tail from rows {', '.join(found['tail_rows'])}"
                if found["tail_rows"] else "; no samples: each reload its median")
        return "P99 TTFT PCIe -> NVLink, " + "; ".join(parts) + tail

    values, texts = _over_trace(
        box, papers, trace, ("cpu-offload", "nvlink"), text,
        lambda inputs, reference, drawn: _s1(inputs, trace, reference, drawn, rates), samples)
    share = (values.get("papers") or {}).get("hit_token_share")
    hit = f" ({share:.1%} of input tokens hit)" if share is not None else ""
    explains = (f"-{S1_REDUCTION:.0%} needs the reload to dominate the P99 TTFT; over the "
                f"conversation trace{hit} the prefill of the misses "
                "dominates unless the prefill is fast: the reduction shrinks as the prefill "
                "slows. The store is unbounded (SwiftCache's HBM budgets are not given), "
                "decode and batching are not modelled; the 3.98x context gain is not recomputed")
    return Claim("S1 load", "S1 under load: P99 TTFT over the conversation trace, KV on a peer "
                 "GPU (NVLink) vs host DRAM (PCIe)", "up to -69% P99 TTFT",
                 texts[0], texts[1],
                 f"Mooncake's conversation trace at its own times through an unbounded prefix "
                 f"store; {B16_REQUEST.model}; {SERVER_GPUS} GPUs of one server, each its own PCIe "
                 f"link and NVLink port, requests in turn; {_prefill_words(prefill)} and without "
                 "(the reload alone); this box's missing hops from swiftcache-media (labelled)",
                 explains, values, tuple((values["box"] or {}).get("rows", ())))


# ---------------------------------------------------------------------------------------------
# S4: Elastic Cache, a reclaim in the middle of the trace


@dataclass(frozen=True, eq=False)
class Placement:
    """Where each request's hit tokens were found (peer HBM or host DRAM), what it recomputes,
    and the reclaim's migration (tokens moved to the host at the reclaim)."""

    peer_tokens: np.ndarray
    host_tokens: np.ndarray
    miss_tokens: np.ndarray
    migrated_tokens: int
    dropped_blocks: int
    reclaim_index: int  # the first request arriving at or after the reclaim


def place(trace: Trace, capacity_blocks: int, reclaim_s: float | None, choice: str,
          share: float = RECLAIM_SHARE) -> Placement:
    """The lent HBM as an LRU prefix store of `capacity_blocks` (evictions dropped) until
    `reclaim_s`; then the donor takes back `share` of it: its least recently used blocks are
    migrated to host DRAM (`migrate`: hit later over PCIe) or dropped (`drop`: missed later and
    recomputed), and the store goes on at the smaller capacity. None: no reclaim."""
    hashes, offsets = trace.hashes.tolist(), trace.offsets.tolist()
    n = len(trace)
    peer, host = np.zeros(n, np.int64), np.zeros(n, np.int64)
    lru: OrderedDict[int, None] = OrderedDict()
    moved: set[int] = set()
    capacity = capacity_blocks
    migrated = dropped = 0
    reclaim_index = n
    for i in range(n):
        if reclaim_s is not None and reclaim_index == n and trace.arrival_s[i] >= reclaim_s:
            reclaim_index = i
            capacity = max(1, capacity_blocks - round(share * capacity_blocks))
            while len(lru) > capacity:
                block, _ = lru.popitem(last=False)
                if choice == "migrate":
                    moved.add(block)
                    migrated += 1
                else:
                    dropped += 1
        blocks = hashes[offsets[i]:offsets[i + 1]]
        in_peer = in_host = 0
        for h in blocks:
            if h in lru:
                in_peer += 1
            elif h in moved:
                in_host += 1
            else:
                break
        for h in blocks:
            if h in moved:
                continue  # stays in host DRAM (not promoted back)
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
        while len(lru) > capacity:
            lru.popitem(last=False)
        peer[i], host[i] = in_peer, in_host
    tokens = trace.input_tokens
    host_t = np.minimum(host * TRACE_BLOCK_TOKENS, tokens)
    hit_t = np.minimum((peer + host) * TRACE_BLOCK_TOKENS, tokens)
    return Placement(hit_t - host_t, host_t, tokens - hit_t, migrated * TRACE_BLOCK_TOKENS,
                     dropped, reclaim_index)


def reclaim_timeline(trace: Trace, placement: Placement, peer_s, host_s, migration_s: float,
                     reclaim_s: float | None, prefill_tokens_per_s: float,
                     gpus: int = SERVER_GPUS) -> np.ndarray:
    """Each request's TTFT: its peer part over its GPU's NVLink port, its host part over the
    server's host link (one FIFO, shared by the GPUs' reloads from host and the reclaim's
    migration, queued at the reclaim), the two in parallel; then its misses prefilled on its
    GPU, first come first served. `peer_s` / `host_s` map tokens to seconds."""
    arrival = trace.arrival_s - trace.arrival_s[0]
    n = len(arrival)
    gpu = np.arange(n) % gpus
    peer_work, host_work = peer_s(placement.peer_tokens), host_s(placement.host_tokens)
    ready = arrival.copy()
    for index in range(gpus):
        mine = np.flatnonzero((gpu == index) & (peer_work > 0))
        if len(mine):
            ready[mine] = np.maximum(ready[mine], fifo(arrival[mine], peer_work[mine])[1])
    jobs_at = arrival[host_work > 0]
    jobs = host_work[host_work > 0]
    owner = np.flatnonzero(host_work > 0)
    if migration_s > 0 and reclaim_s is not None:
        at = reclaim_s - trace.arrival_s[0]
        where = int(np.searchsorted(jobs_at, at, side="left"))
        jobs_at = np.insert(jobs_at, where, at)
        jobs = np.insert(jobs, where, migration_s)
        owner = np.insert(owner, where, -1)
    if len(jobs):
        end = fifo(jobs_at, jobs)[1]
        mine = owner >= 0
        ready[owner[mine]] = np.maximum(ready[owner[mine]], end[mine])
    prefill = placement.miss_tokens / prefill_tokens_per_s
    done = np.empty(n)
    for index in range(gpus):
        mine = np.flatnonzero(gpu == index)
        mine = mine[np.argsort(ready[mine], kind="stable")]
        done[mine] = fifo(ready[mine], prefill[mine])[1]
    return done - arrival


def _block_bytes() -> int:
    """One of the trace's 512-token blocks of the request's model, in bytes."""
    return shape_of(dataclasses.replace(B16_REQUEST, context=TRACE_BLOCK_TOKENS)).total_bytes


def _rate(service, tokens: np.ndarray):
    """tokens -> seconds over a path: the path's figure inside its grid, linear in tokens past
    its largest read (the migration's one read is larger than `nearlocal kv` cuts)."""
    top = float(service.tokens[-1])
    per_token = float(service.reload_s(np.array([top]))[0]) / top

    def seconds(values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, float)
        inside = service.reload_s(np.minimum(values, top))
        return np.where(values > top, values * per_token, inside)

    return seconds


def reclaim_costs(inputs: WhatifInputs, trace: Trace, reference: ReferenceBox | None, samples=None,
        lent_gib: Iterable[int] = LENT_GIB, prefill: Iterable[float] = PREFILL_GRID) -> dict:
    per_block = _block_bytes()
    reclaim_s = float(trace.arrival_s[0] + trace.duration_s / 2)
    found: dict = {"reclaim_at_s": reclaim_s - float(trace.arrival_s[0]), "table": []}
    rows: dict[str, None] = {}
    for gib in lent_gib:
        capacity = max(1, int(gib * 2**30 // per_block))
        runs = {"none": place(trace, capacity, None, "drop"),
                "migrate": place(trace, capacity, reclaim_s, "migrate"),
                "drop": place(trace, capacity, reclaim_s, "drop")}
        sizes = np.concatenate([p.peer_tokens for p in runs.values()]
                               + [p.host_tokens for p in runs.values()])
        grid = np.unique(np.concatenate([sizes[sizes > 0], [TRACE_BLOCK_TOKENS]]))
        nvlink = path_service("nvlink", B16_REQUEST, inputs, grid, reference=reference, samples=samples)
        pcie = path_service("cpu-offload", B16_REQUEST, inputs, grid, reference=reference, samples=samples)
        if nvlink.missing or pcie.missing:
            return {"missing": "; ".join(s.missing for s in (nvlink, pcie) if s.missing)}
        rows.update(dict.fromkeys(_provenance(nvlink, pcie)))
        found["ways"] = tuple(dict.fromkeys((*nvlink.ways, *pcie.ways)))
        peer_s, host_s = _rate(nvlink, grid), _rate(pcie, grid)
        start = runs["migrate"].reclaim_index
        window = (trace.arrival_s >= reclaim_s) & (trace.arrival_s < reclaim_s + S4_WINDOW_S)
        for rate in prefill:
            entry: dict = {"lent_gib": gib, "capacity_blocks": capacity,
                           "prefill_tokens_per_s": rate}
            for choice, placement in runs.items():
                migration = (float(host_s(np.array([placement.migrated_tokens]))[0])
                             if placement.migrated_tokens else 0.0)
                ttft = reclaim_timeline(trace, placement, peer_s, host_s, migration,
                                        None if choice == "none" else reclaim_s, rate)
                after = ttft[start:]
                entry[choice] = {
                    "window_p99_s": float(np.percentile(ttft[window], 99)) if window.any()
                    else None,
                    "window_mean_s": float(ttft[window].mean()) if window.any() else None,
                    "after_mean_s": float(after.mean()) if len(after) else None,
                    "migrated_bytes": placement.migrated_tokens // TRACE_BLOCK_TOKENS * per_block,
                    "migration_s": migration, "dropped_blocks": placement.dropped_blocks,
                    "recomputed_tokens": int(placement.miss_tokens[start:].sum()),
                    "host_hit_tokens": int(placement.host_tokens.sum())}
            base = entry["none"]["after_mean_s"]
            for choice in ("migrate", "drop"):
                entry[choice]["cost_mean_s"] = entry[choice]["after_mean_s"] - base
                entry[choice]["extra_tokens"] = (entry[choice]["recomputed_tokens"]
                                                 - entry["none"]["recomputed_tokens"])
            found["table"].append(entry)
    found["rows"] = tuple(rows)
    return found


def claim_s4(box: WhatifInputs, papers: WhatifInputs, samples=None, trace: Trace | None = None,
             prefill: tuple[float, ...] | None = None) -> Claim:
    rates = prefill or PREFILL_GRID

    def text(found: dict) -> str:
        parts = []
        for e in found["table"]:
            m, d = e["migrate"], e["drop"]
            parts.append(
                f"{e['lent_gib']} GiB lent, {e['prefill_tokens_per_s']:g} tok/s: migrate "
                f"{m['migrated_bytes'] / 1e9:.1f} GB in {_s(m['migration_s'])}, window P99 "
                f"{_s(m['window_p99_s'])}, {_signed(m['cost_mean_s'])} mean after; drop "
                f"{d['dropped_blocks']} blocks, +{d['extra_tokens']} tokens recomputed, "
                f"window P99 {_s(d['window_p99_s'])}, {_signed(d['cost_mean_s'])} mean after "
                f"(no reclaim: window P99 {_s(e['none']['window_p99_s'])}); cheaper: "
                + ("migrate" if m["cost_mean_s"] < d["cost_mean_s"] else "drop"))
        return "; ".join(parts)

    values, texts = _over_trace(
        box, papers, trace, ("nvlink", "cpu-offload"), text,
        lambda inputs, reference, drawn: reclaim_costs(inputs, trace, reference, drawn,
                                                       prefill=rates), samples)
    return Claim("S4", "Elastic Cache: the donor reclaims half its lent HBM in the middle of "
                 "the trace; its blocks migrated to host DRAM or dropped and recomputed",
                 "no figure (the paper describes the mechanism: reclaimed blocks go to CPU "
                 "memory or are recomputed)", texts[0], texts[1],
                 f"the conversation trace at its own times; {B16_REQUEST.model}, 512-token blocks "
                 f"of {_block_bytes() >> 20} MiB; "
                 f"the lent HBM an LRU prefix store (evictions dropped), lent capacity not given: "
                 f"{', '.join(f'{g} GiB' for g in LENT_GIB)}; at the trace's midpoint the donor "
                 f"takes back {RECLAIM_SHARE:.0%} (its least recently used blocks), one step; "
                 f"migrated blocks stay in host DRAM and reload over PCIe; {SERVER_GPUS} GPUs, "
                 "each its own NVLink port, one host link shared by their PCIe reloads and the "
                 "migration (GPU -> host taken at host -> GPU's figure: the write direction is "
                 "not measured; the migration one job queued at the reclaim, a host hit waiting "
                 "behind it, which overstates: a block not yet moved could still be read from "
                 f"the donor); each reload its model's median (no spread drawn); "
                 f"{_prefill_words(prefill)}; TTFT over the {S4_WINDOW_S:.0f} s "
                 "after the reclaim and the mean over the rest of the trace, against no reclaim",
                 "what the reclaim costs in reload, queueing and recompute: migrating moves the "
                 "reclaimed bytes once over PCIe (a burst the host link queues) and keeps their "
                 "later hits; dropping costs nothing at the reclaim and a prefill at each later "
                 "hit; which is cheaper turns on the host link's rate against the prefill's. Migrated "
                 "blocks stay in host DRAM (not bounded), so migrating can even beat no reclaim "
                 "when the trace asks for them later than the LRU keeps blocks. Not modelled: how "
                 "the donor's own demand sets the step, the host DRAM's "
                 "capacity, promotion back to HBM, decode and batching",
                 values, tuple((values["box"] or {}).get("rows", ())))


LOAD_CLAIMS = (claim_b3_load, claim_b16_load, claim_s1_load, claim_s4)


def load_claims(box: WhatifInputs, papers: dict[str, WhatifInputs], samples=None,
                trace: Trace | None = None,
                prefill: tuple[float, ...] | None = None) -> list[Claim]:
    """The load claims, the papers' columns from beluga-h20 (B3, B16) and swiftcache-media
    (S1, S4); `trace` (the shipped one when present) drives S1 and S4; `prefill` (tokens/s per
    GPU, the user's) replaces the grid S1 and S4 show where no paper gives one."""
    which = {claim_b3_load: "beluga-h20", claim_b16_load: "beluga-h20",
             claim_s1_load: "swiftcache-media", claim_s4: "swiftcache-media"}
    return [build(box, papers[which[build]], samples, trace, prefill) for build in LOAD_CLAIMS]


def shipped_trace() -> Trace | None:
    """The shipped conversation trace, or None where the checkout lacks it."""
    from nearlocal.whatif.traffic import read_trace

    return read_trace(TRACE) if TRACE.is_file() else None
