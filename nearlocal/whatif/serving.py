"""What a box's paths mean for serving one model: KV bytes per request, fragments per read (cut
by the same code as `nearlocal kv`), reload time per turn over each serving path, layer-wise
pipelining against a given compute time, the break-even against recomputing the prefill, and the
throughput a path can carry. Every term names the rows or the reference box it came from; a hop
neither measured nor filled from a reference is said so, never left out."""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field

from nearlocal.errors import UsageError
from nearlocal.whatif.fit import PathFit, Prediction
from nearlocal.whatif.paths import HOPS, SERVING_PATHS, ServingPath
from nearlocal.whatif.references import ReferenceBox

NOT_MEASURED = "not measured on this box"
SUPERBLOCK_TOKENS = 256  # a superblock (workloads.selections), Mooncake's remedy in B3
SELECTIONS = ("dense", "superblock")


@dataclass(frozen=True)
class Request:
    """One request's reload, as a serving stack sees it. The defaults are Beluga's B16 setup:
    Qwen2.5-32B, 16K-token inputs, every token cached, TP 1, vLLM flash-attn 16-token blocks."""

    model: str = "qwen2.5-32b"
    context: int = 16384  # tokens of the request's context
    cached: float = 1.0  # the share of them whose KV is reloaded (not recomputed)
    tp: int = 1
    layout: str | None = None  # None: mla for an MLA model, else flash-attn
    block_tokens: int | None = None  # the layout's default
    dtype: str | None = None  # the model's
    gpus_per_link: int = 1  # GPUs sharing one adapter / NIC / link
    layer_compute_us: float | None = None  # a layer's compute per turn, for the pipelined figure
    prefill_tokens_per_s: float | None = None  # for the break-even against recomputing
    select: str = "dense"  # dense: the layout's blocks; superblock: 256-token groups (B3)
    batch: int = 1  # requests whose KV reloads in the same turn over the same link
    # what each request costs besides moving its bytes (cache lookup, metadata, scheduling),
    # given by the user, never measured here: an agentic KV cache on H20 reloads 64K tokens
    # from CPU DRAM in 272 ms, 111 ms of it fixed per request (issue 57)
    fixed_ms: float = 0.0

    def check(self) -> None:
        if self.batch < 1:
            raise UsageError(f"--batch must be at least 1 request, got {self.batch}")
        if self.select not in SELECTIONS:
            raise UsageError(f"--select {self.select!r}: one of {', '.join(SELECTIONS)}")
        if self.context <= 0:
            raise UsageError(f"--context must be a positive number of tokens, got {self.context}")
        if not 0 < self.cached <= 1:
            raise UsageError(f"--cached must lie in (0, 1], got {self.cached}")
        if self.gpus_per_link < 1:
            raise UsageError(f"--gpus-per-link must be at least 1, got {self.gpus_per_link}")
        if not (self.fixed_ms >= 0 and math.isfinite(self.fixed_ms)):
            raise UsageError(f"--fixed-ms must be a finite number of ms, 0 or more, got "
                             f"{self.fixed_ms}")
        for name, value in (("--layer-compute-us", self.layer_compute_us),
                            ("--prefill-tokens-per-s", self.prefill_tokens_per_s)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise UsageError(f"{name} must be a positive number, got {value}")

    @property
    def cached_tokens(self) -> int:
        return max(1, round(self.context * self.cached))

    @property
    def fixed_ns(self) -> float:
        """The turn's fixed cost: each of its requests' own, one after another."""
        return self.batch * self.fixed_ms * 1e6


@dataclass(frozen=True)
class Shape:
    """One read of the request's cached KV, as the layout cuts it (one TP rank's share)."""

    pattern: str  # the kv: pattern (`nearlocal run --pattern`, `nearlocal kv`)
    layout: str
    layers: int
    bytes_per_token: int  # every layer's K and V of one token on one rank
    total_bytes: int
    fragments: int
    fragment_bytes: int  # the median
    blocks: int


@functools.lru_cache(maxsize=32)
def shape_of(request: Request) -> Shape:
    """The request's read cut by `nearlocal kv`'s code: whole blocks of the cached tokens,
    scattered in the pool as a paged cache leaves them."""
    from nearlocal.workloads import kv
    from nearlocal.workloads.layouts import get_layout
    from nearlocal.workloads.llm_configs import get_model

    request.check()
    model = get_model(request.model)  # an unknown model: its own one-line error
    layout = get_layout(request.layout or ("mla" if model.is_mla else "flash-attn"))
    block_tokens = request.block_tokens or layout.default_block_tokens
    layout.check_block_tokens(block_tokens)
    tokens = SUPERBLOCK_TOKENS if request.select == "superblock" else block_tokens
    blocks = -(-request.cached_tokens // tokens)
    options = [f"tp={request.tp}", f"bt={block_tokens}", "blocks=scattered"]
    if request.dtype:
        options.append(f"dtype={request.dtype}")
    if ":" in request.model:
        raise UsageError(f"--model {request.model!r}: a config path for kv patterns cannot hold ':'")
    text = ":".join(["kv", request.model, layout.name, f"{request.select}:{blocks}", *options])
    try:
        pattern = kv.parse_kv_pattern(text)
        geometry = kv.parse_plan(text).geometry
    except UsageError as exc:  # past nearlocal kv's bounds: said for the request given
        raise UsageError(f"{request.model} at {request.cached_tokens} cached tokens "
                         f"({blocks} blocks of {tokens}): {exc}") from None
    return Shape(text, layout.name, geometry.layers, geometry.layers * geometry.parts * geometry.token_bytes,
                 pattern.total_bytes, pattern.count, pattern.fragment_bytes, blocks)


@dataclass(frozen=True)
class Term:
    """One hop of a path's route for this request."""

    hop: str
    what: str
    fragments: int
    fragment_bytes: int
    ns: float | None  # None: not measured and no reference fills it
    way: str  # the way chosen (method, regions) or the reference
    source: str  # "measured" or the reference's label
    rows: tuple[str, ...]
    notes: tuple[str, ...] = ()
    gpus: tuple[int, ...] = ()  # the GPUs its rows moved bytes to or from (measured terms)


@dataclass(frozen=True)
class PathFigures:
    """One serving path's figures for the request."""

    path: str
    what: str
    terms: tuple[Term, ...]
    complete: bool
    reload_ns: float | None  # the turn's (the batch's) route terms in series and its fixed cost
    pipelined_ns: float | None  # t_ld + (N - 1) max(t_ld, t_c) + t_c
    recompute_ns: float | None  # prefilling the cached tokens instead
    beats_recompute: bool | None
    requests_per_s: float | None  # what the path carries: one link, k GPUs sharing it
    gbps: float | None  # the request's bytes over its reload time
    measured: bool  # every term measured on this box (no reference figure)
    notes: tuple[str, ...] = ()
    fixed_ns: float = 0.0  # the part of reload_ns fixed per request (Request.fixed_ms, given)
    # the adapter (or NIC) the path's GPU shares on the run's box, and with which GPUs
    # (ServingPath.adapter; the run's inventory's links); "" where the path has none
    shares: str = ""


@dataclass(frozen=True)
class Whatif:
    request: Request
    shape: Shape
    paths: tuple[PathFigures, ...]
    run: str  # the run's id
    emulated: str  # why the run's figures are not a real box's ("" when they are)
    reference: str  # the reference box's label ("" when none)

    def as_dict(self) -> dict:
        return asdict(self)


def best_way(models: list[PathFit], fragments: int, size: int,
             gather: bool = False) -> tuple[PathFit, Prediction] | None:
    """The fastest way for this shape, preferring figures inside the measured sizes; for a
    `gather` (the request's scattered fragments) only a way whose method can read them (None:
    no way can)."""
    scored = [(p.outside, p.ns, m.way, m, p) for m in models if m.gathers or not gather
              for p in (m.predict(fragments, size),)]
    if not scored:
        return None
    scored.sort(key=lambda s: (s[0], s[1], s[2]))
    return scored[0][3], scored[0][4]


def _term(hop: str, fragments: int, size: int, measured: dict[str, list[PathFit]],
          reference: ReferenceBox | None, gather: bool = False) -> Term:
    what = HOPS[hop].what
    found = best_way(measured.get(hop) or [], fragments, size, gather)
    if found is None and reference is not None and reference.links.get(hop):
        found = best_way(list(reference.links[hop]), fragments, size, gather)
    if found is None:
        why = NOT_MEASURED
        if measured.get(hop):  # measured, but only by ways that write (scatter)
            why = ("not measured as a gather on this box (its ways of this hop only write: "
                   + ", ".join(m.way for m in measured[hop]) + ")")
        why += f" nor in reference {reference.name}" if reference else ""
        return Term(hop, what, fragments, size, None, "-", why, ())
    model, prediction = found
    return Term(hop, what, fragments, size, prediction.ns, model.way, model.source,
                prediction.rows, prediction.notes, model.gpus)


def _route_terms(route: tuple[str, ...], shape: Shape, batch: int,
                 measured: dict[str, list[PathFit]],
                 reference: ReferenceBox | None) -> list[Term]:
    terms = []
    for position, hop in enumerate(route):
        if position == 0:  # the batch's fragments as the layout cuts them: a gather
            fragments, size = shape.fragments * batch, shape.fragment_bytes
        else:  # what the first hop packed: one piece per layer and request
            fragments, size = shape.layers * batch, max(1, shape.total_bytes // shape.layers)
        terms.append(_term(hop, fragments, size, measured, reference,
                           gather=position == 0 and fragments > 1))
    return terms


def _route_key(terms: list[Term]) -> tuple:
    """Complete routes first; among them the one with the larger share of terms this box
    measured (a reference fills what the box lacks, it does not outrank what it measured), then
    the fastest; among incomplete routes the one that measured most."""
    missing = sum(t.ns is None for t in terms)
    measured = sum(t.source == "measured" for t in terms)
    total = sum(t.ns for t in terms if t.ns is not None)
    if missing:
        return (1, -measured, missing, 0.0)
    return (0, -measured / len(terms), 0, total)


def adapter_shared(path: ServingPath, terms: list[Term], request: Request,
                   topology: dict | None) -> str:
    """Which adapter (or NIC) the path's GPU shares on the run's box: for the GPUs its measured
    terms moved bytes to (every GPU where none did), the one of the path's kind nearest each
    (probe/links.py: under its root port, else on its socket), the GPUs whose nearest it is
    too, and whether the GPU's path to it crosses a socket. The request's --gpus-per-link is
    named where the box shares it among more GPUs."""
    from nearlocal.probe.links import KIND_WORDS, adapter_shares

    if path.adapter is None:
        return ""
    word = KIND_WORDS.get(path.adapter, path.adapter)
    shares, why = adapter_shares(topology, path.adapter,
                                 tuple(sorted({g for t in terms for g in t.gpus})))
    if not shares:
        return f"which {word} its GPU shares: {why}"
    parts = []
    for share in shares:
        others = share.sharers[1:]
        parts.append(f"{share.gpu} shares {word} {share.adapter} with {', '.join(others)}"
                     if others else f"{share.gpu} has {word} {share.adapter} to itself")
        parts[-1] += f" ({share.relation})"
    most = max(len(share.sharers) for share in shares)
    if most > request.gpus_per_link:
        parts.append(f"{most} GPUs share it on this box: --gpus-per-link {most} shares the link "
                     f"as they do (given {request.gpus_per_link})")
    return "; ".join(parts)


def path_figures(name: str, request: Request, shape: Shape,
                 measured: dict[str, list[PathFit]],
                 reference: ReferenceBox | None = None,
                 topology: dict | None = None, box: bool = False) -> PathFigures:
    """One serving path's figures; `box`: the inputs are a run's, whose inventory's links
    (`topology`, None where the run has none) say which adapter the path's GPU shares."""
    path = SERVING_PATHS[name]
    routes = [_route_terms(route, shape, request.batch, measured, reference)
              for route in path.routes]
    terms = min(routes, key=_route_key)
    complete = all(t.ns is not None for t in terms)
    notes = []
    if len(terms) > 1:
        notes.append("hops in series: the route's terms are added (no overlap between them)")
    fixed = request.fixed_ns
    if fixed:
        notes.append(f"{request.fixed_ms:g} ms fixed per request (given: lookup, metadata, "
                     f"scheduling) added to the turn's reload, once per request, before its bytes "
                     "move")
    reload_ns = sum(t.ns for t in terms) + fixed if complete else None
    pipelined = recompute = beats = rps = gbps = None
    if reload_ns is not None:
        batch = request.batch
        gbps = batch * shape.total_bytes / reload_ns if reload_ns > 0 else None
        # the link carries one turn's reload at a time; k GPUs sharing it divide it
        rps = batch * 1e9 / reload_ns / request.gpus_per_link if reload_ns > 0 else None
        if request.layer_compute_us is not None:
            load = (reload_ns - fixed) / shape.layers  # the fixed cost is paid once, not a layer
            compute = request.layer_compute_us * 1e3
            pipelined = fixed + load + (shape.layers - 1) * max(load, compute) + compute
        if request.prefill_tokens_per_s is not None:
            recompute = request.batch * request.cached_tokens / request.prefill_tokens_per_s * 1e9
            beats = reload_ns < recompute
    return PathFigures(name, path.what, tuple(terms), complete, reload_ns, pipelined, recompute,
                       beats, rps, gbps,
                       complete and all(t.source == "measured" for t in terms), tuple(notes),
                       fixed, adapter_shared(path, terms, request, topology) if box else "")


@dataclass(frozen=True)
class WhatifInputs:
    """What the what-if is computed from: a run's fitted hops and who the run is."""

    measured: dict[str, list[PathFit]] = field(default_factory=dict)
    run: str = ""
    emulated: str = ""
    # a stored run's inputs (inputs_of), whose inventory's links (probe/links.py: `topology`,
    # None where the run was stored before they were read) say which adapter a path's GPU
    # shares; False: inputs that are no box's (a reference's, a test's), of which nothing is said
    box: bool = False
    topology: dict | None = None


def whatif(inputs: WhatifInputs, request: Request, reference: ReferenceBox | None = None) -> Whatif:
    shape = shape_of(request)
    paths = tuple(path_figures(name, request, shape, inputs.measured, reference,
                               inputs.topology, inputs.box)
                  for name in SERVING_PATHS)
    return Whatif(request, shape, paths, inputs.run, inputs.emulated,
                  reference.label if reference else "")
