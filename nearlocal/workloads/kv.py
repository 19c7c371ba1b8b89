"""The `kv:` pattern kind: fragment tables cut from a real model's KV-cache layout.

    kv:MODEL[:LAYOUT][:SELECT[:N]][:key=value...]
    kv:COUNTxSIZE[@STRIDE]                      an explicit shape (1024x160B, 128x20KiB)

MODEL is a built-in name (qwen2.5-32b, qwen3-32b, qwen3-8b, llama-3.1-8b, llama-3.1-70b,
deepseek-v3, deepseek-v3.2) or the path of a local config.json; LAYOUT is flash-attn (default),
flashinfer, mla, cross-layer or lmcache; SELECT is dense[:N] (default, 1 block), superblock[:N]
or sparse[:K] (K defaults to 256). Keys: tp=1, bt=BLOCK_TOKENS (layout default),
dtype=bf16|fp16|fp8|fp32|fp8_ds_mla (the model's), order=nhd|hnd, blocks=contiguous|scattered,
pool=BLOCKS (blocks in the pool), layers=A-B or layers=A (default all), ctx=TOKENS (sparse
context, 4096), dist=uniform|clustered, run=8 (clustered run length), seed=0, align=SIZE (each
per-layer tensor starts on a multiple of SIZE, e.g. 2MiB; default back to back).

Example: `kv:qwen2.5-32b:flash-attn:dense` is one 16-token block of Qwen2.5-32B at TP 1:
128 fragments of 32 KiB (K and V of 64 layers). Fragments are (offset in the region, offset in the
packed local buffer, length): the region holds vLLM's layout (per-layer tensors back to back; no
fragment spans two), the local buffer or peer the packed copy. The pattern's axes carry the model,
layout, selection, contiguity, the tensors the layout side holds (layout_side / packed_side say
which side is which) and the RDMA work requests the list would need at 30 scatter-gather entries
each (B2). Names (layouts, selections, keys, values) are case-insensitive; dtype takes vLLM's
--kv-cache-dtype names too (fp8_ds_mla: 656 B per MLA token).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from nearlocal.core.patterns import Pattern, parse_pattern, register_pattern_kind
from nearlocal.errors import UsageError
from nearlocal.lazy import lazy_import
from nearlocal.units import format_size, parse_size
from nearlocal.workloads.layouts import LAYOUTS, KvGeometry, get_layout, layout_key
from nearlocal.workloads.llm_configs import get_model, kv_dtype

np = lazy_import("numpy")

selections = lazy_import("nearlocal.workloads.selections")  # numba: compiled when a read is built

RDMA_MAX_SGE = 30  # ConnectX-7's scatter-gather list limit quoted by Beluga (B2)
_EXPLICIT = re.compile(r"^[0-9]+x[^:@]+(@[^:]+)?$", re.IGNORECASE)
_WHOLE = re.compile(r"[0-9]{1,18}")  # ASCII digits, short enough to stay an int64
_KEYS = ("tp", "bt", "dtype", "order", "blocks", "pool", "layers", "ctx", "dist", "run", "seed",
         "align")
_INT_KEYS = ("tp", "bt", "pool", "ctx", "run", "seed")
SYNTAX = ("kv:MODEL[:LAYOUT][:dense[:N]|superblock[:N]|sparse[:K]][:key=value...] "
          "(keys tp, bt, dtype, order, blocks, pool, layers, ctx, dist, run, seed, align) "
          "or kv:COUNTxSIZE")


def rdma_work_requests(fragments: int, max_sge: int = RDMA_MAX_SGE) -> int:
    """Work requests to post a list when each carries at most `max_sge` local pieces (B2)."""
    return -(-fragments // max_sge)


def contiguity(pieces: int, fragments: int) -> float:
    """Fraction of selected pieces that continue the previous one in the pool (merged away)."""
    return (pieces - fragments) / pieces if pieces else 0.0


@dataclass(frozen=True)
class KvPlan:
    """A parsed kv: pattern: the pool geometry, the selection and the inputs the metadata step
    turns into the fragment table (block table, and token choices for sparse)."""

    text: str
    geometry: KvGeometry
    selection: selections.Selection
    layers: np.ndarray  # int64 selected layer indices

    @property
    def pieces(self) -> int:
        """Pieces before merging, from the geometry alone (nothing built)."""
        g, sel, nl = self.geometry, self.selection, int(self.layers.size)
        if sel.kind == "sparse":
            return nl * g.parts * g.heads * sel.count
        outer = nl * g.parts * (g.heads if g.layout.name == "cross-layer" and g.order == "hnd"
                                else 1)
        if g.layout.name in ("flashinfer", "mla"):
            outer = nl
        return outer * sel.blocks_needed(g.block_tokens)

    @property
    def table(self) -> np.ndarray:
        return self.selection.block_table(self.geometry.block_tokens, self.geometry.pool_blocks)

    def tokens(self) -> np.ndarray:
        return self.selection.tokens(self.layers.size, self.geometry.heads)

    def build(self) -> tuple[np.ndarray, int]:
        """(fragment table, pieces before merging) through the compiled builders."""
        geometry = self.geometry
        if self.selection.kind == "sparse":
            return selections.build_sparse(self.table, self.tokens(), geometry.sparse(self.layers),
                                           geometry.block_tokens)
        return selections.build_dense(self.table, geometry.dense(self.layers))

    def axes(self, frags: np.ndarray, pieces: int) -> dict:
        g = self.geometry
        layers = (f"{self.layers[0]}-{self.layers[-1]}" if self.layers.size > 1
                  else str(self.layers[0]))
        return {
            "model": g.model.name, "layout": g.layout.name, "select": self.selection.label,
            "tp": g.tp, "block_tokens": g.block_tokens, "kv_dtype": g.dtype, "order": g.order,
            "placement": self.selection.placement, "layers": layers,
            "fragment_count": int(frags.shape[0]),
            "fragment_bytes": int(np.median(frags[:, 2])) if frags.size else 0,
            "pieces": pieces, "contiguity": contiguity(pieces, int(frags.shape[0])),
            "rdma_work_requests": rdma_work_requests(int(frags.shape[0])),
            "pool_bytes": g.pool_bytes,
            "kv_tensors": g.tensors, "layout_side": "region", "packed_side": "peer",
        }


def _parse_layers(text: str, total: int) -> np.ndarray:
    match = re.fullmatch(r"([0-9]{1,18})(?:-([0-9]{1,18}))?", text)
    if not match:
        raise UsageError(f"malformed layers={text!r}: use layers=A-B or layers=A")
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) else first
    if first > last or last >= total:
        raise UsageError(f"layers={text} is outside 0-{total - 1}")
    return np.arange(first, last + 1, dtype=np.int64)


def parse_plan(text: str) -> KvPlan:
    """The plan of a `kv:MODEL...` text (not the explicit COUNTxSIZE form)."""
    fields = str(text).strip().split(":")
    if fields[0] != "kv" or len(fields) < 2 or not fields[1]:
        raise UsageError(f"malformed kv pattern {text!r}: use {SYNTAX}")
    model = get_model(fields[1])
    layout_name, kind, count, options = None, None, None, {}
    for token in fields[2:]:
        key, eq, value = token.partition("=")
        key, value, word = key.strip().lower(), value.strip(), token.strip().lower()
        if eq:
            if key not in _KEYS:
                raise UsageError(f"unknown kv option {key!r} in {text!r}: valid are "
                                 f"{', '.join(_KEYS)}")
            if key in _INT_KEYS and not _WHOLE.fullmatch(value):
                raise UsageError(f"kv option {key}={value!r} in {text!r} must be a whole number "
                                 "(at most 18 digits)")
            options[key] = int(value) if key in _INT_KEYS else value.lower()
        elif layout_key(word) and layout_name is None:
            layout_name = layout_key(word)
        elif word in selections.KINDS and kind is None:
            kind = word
        elif word.isdigit() and kind is not None and count is None:
            if not _WHOLE.fullmatch(word):
                raise UsageError(f"{kind}:{word} in {text!r}: the count must be a whole number "
                                 "(at most 18 digits)")
            count = int(word)
        else:
            raise UsageError(f"unexpected {token!r} in kv pattern {text!r}: use {SYNTAX}; "
                             f"layouts are {', '.join(LAYOUTS)}")
    layout = get_layout(layout_name or "flash-attn")
    kind = kind or "dense"
    count = count if count is not None else (
        selections.DEFAULT_TOP_K if kind == "sparse" else 1)
    selection = selections.Selection(
        kind, count, placement=options.get("blocks", "contiguous"),
        context=options.get("ctx", selections.DEFAULT_CONTEXT),
        distribution=options.get("dist", "uniform"), run=options.get("run", 8),
        seed=options.get("seed", 0))
    block_tokens = options.get("bt", layout.default_block_tokens)
    layout.check_block_tokens(block_tokens)
    pool = options["pool"] if "pool" in options else selection.default_pool(block_tokens)
    align = parse_size(options["align"]) if "align" in options else 0
    geometry = KvGeometry(model, layout, options.get("tp", 1), block_tokens,
                          kv_dtype(options.get("dtype"), model), options.get("order", "nhd"), pool,
                          align)
    layers = (_parse_layers(options["layers"], model.layers) if "layers" in options
              else np.arange(model.layers, dtype=np.int64))
    plan = KvPlan(str(text).strip(), geometry, selection, layers)
    selections.check_pieces(plan.pieces, f"{text!r}")  # before the table or tokens are drawn
    return plan


def is_explicit(text: str) -> bool:
    body = str(text).strip().removeprefix("kv:")
    return bool(_EXPLICIT.match(body))


@lru_cache(maxsize=16)
def _parse_cached(text: str) -> Pattern:
    if is_explicit(text):
        shape = parse_pattern(text.removeprefix("kv:"))
        frags = shape.frags
        axes = {"model": "-", "layout": "-", "select": "explicit",
                "fragment_count": shape.count, "fragment_bytes": shape.fragment_bytes,
                "pieces": shape.count, "contiguity": 0.0,
                "rdma_work_requests": rdma_work_requests(shape.count),
                "layout_side": "region", "packed_side": "peer"}
        return Pattern(text, frags, axes)
    plan = parse_plan(text)
    frags, pieces = plan.build()
    return Pattern(text, frags, plan.axes(frags, pieces))


def parse_kv_pattern(text: str) -> Pattern:
    """The pattern-kind parser: a fresh Pattern (its frags array is a copy callers may keep)."""
    cached = _parse_cached(str(text).strip())
    return Pattern(cached.text, cached.frags.copy(), dict(cached.axes))


def _real_pieces() -> dict[str, int]:
    """The piece sizes the real configs give for the shapes the papers quote (B2, B14)."""
    qwen = parse_plan("kv:qwen2.5-32b:flash-attn:dense").geometry
    qwen_fp8 = parse_plan("kv:qwen2.5-32b:flash-attn:dense:dtype=fp8").geometry
    qwen_tp2 = parse_plan("kv:qwen2.5-32b:flash-attn:dense:tp=2").geometry
    ds = parse_plan("kv:deepseek-v3:mla:dense").geometry
    ds_sparse = get_model("deepseek-v3.2")
    return {
        "block_pieces": qwen.layers * qwen.parts, "block_piece": qwen.part_block_bytes,
        "block_piece_tp2": qwen_tp2.part_block_bytes, "block_piece_fp8": qwen_fp8.part_block_bytes,
        "block_tokens": qwen.block_tokens, "kv_heads": qwen.heads, "head_dim": qwen.model.head_dim,
        "unit": qwen.unit, "unit_fp8": qwen_fp8.unit, "layers": qwen.layers,
        "mla": ds.unit, "mla_fp8": ds.model.head_bytes("fp8"),
        "mla_ds": ds_sparse.head_bytes("fp8_ds_mla"),
    }


def paper_note(count: int, size: int) -> str | None:
    """Why a paper's quoted shape (Beluga B2 20 KB x 128, B14 160 B x 1024) is not what the real
    configs give, with the real numbers; None for other shapes."""
    r = _real_pieces()
    if count == r["block_pieces"] and 19_000 <= size <= 21 * 1024:
        return (f"Beluga B2 quotes {count} non-contiguous 20 KB pieces for one Qwen-32B KV "
                f"block; that does not follow from Qwen2.5-32B's config: {r['layers']} layers x K, V = "
                f"{r['block_pieces']} pieces of {r['block_tokens']} tokens x {r['kv_heads']} KV "
                f"heads x {r['head_dim']} x 2 B = {format_size(r['block_piece'])} at TP 1 "
                f"({format_size(r['block_piece_tp2'])} at TP 2, "
                f"{format_size(r['block_piece_fp8'])} in fp8); the real shape is "
                "kv:qwen2.5-32b:flash-attn:dense")
    if count == 1024 and size == 160:
        sparse = r["layers"] * 2 * r["kv_heads"] * 256
        return (f"Beluga B14 quotes {count} fragments of 160 B for a top-256 read; that does not "
                f"follow from a real config: one (token, KV head) piece of K or V is head_dim x "
                f"dtype = {r['unit']} B for Qwen2.5-32B ({r['unit_fp8']} B in fp8), one "
                f"DeepSeek-V3 MLA token {r['mla']} B ({r['mla_fp8']} B fp8; DeepSeek-V3.2's "
                f"fp8_ds_mla {r['mla_ds']} B), and top-256 per KV head per layer of Qwen2.5-32B is "
                f"{r['layers']} x 2 x {r['kv_heads']} x 256 = {sparse} pieces; the real shape is "
                "kv:qwen2.5-32b:flash-attn:sparse:256")
    return None


def size_histogram(lengths: np.ndarray) -> list[tuple[str, int, int]]:
    """(label, fragments, bytes) per distinct size, or per power-of-two bucket when many sizes."""
    lengths = np.asarray(lengths, np.int64)
    sizes, counts = np.unique(lengths, return_counts=True)
    if sizes.size <= 8:
        return [(format_size(int(s)), int(c), int(s) * int(c)) for s, c in zip(sizes, counts,
                                                                                strict=True)]
    buckets = np.floor(np.log2(lengths)).astype(np.int64)
    rows = []
    for b in np.unique(buckets):
        mask = buckets == b
        rows.append((f"{format_size(1 << int(b))}-{format_size((1 << int(b + 1)) - 1)}",
                     int(mask.sum()), int(lengths[mask].sum())))
    return rows


register_pattern_kind("kv", parse_kv_pattern, SYNTAX)
