"""KV fragment lists against real tensors: for every layout, build the pool the layout describes
with numpy, gather it through the generated fragment table, and compare with the same selection
made by numpy indexing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from nearlocal.errors import UsageError
from nearlocal.kernels import cpu
from nearlocal.workloads import kv
from nearlocal.workloads.kernels import time_dense_metadata, time_sparse_metadata
from nearlocal.workloads.llm_configs import BUILTIN, from_hf_config, get_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, str]:
    """Local config.json files of a tiny GQA model and a tiny MLA model."""
    root = tmp_path_factory.mktemp("models")
    gqa = root / "tiny-gqa"
    gqa.mkdir()
    (gqa / "config.json").write_text(json.dumps({
        "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 4,
        "hidden_size": 64, "torch_dtype": "bfloat16"}))  # head_dim 8
    mla = root / "tiny-mla"
    mla.mkdir()
    (mla / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "hidden_size": 64, "kv_lora_rank": 12, "qk_rope_head_dim": 4,
        "torch_dtype": "bfloat16"}))
    return {"gqa": str(gqa / "config.json"), "mla": str(mla / "config.json")}


def _values(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**16, size=shape, dtype=np.uint16)


def _place(per_layer: list[np.ndarray], g) -> np.ndarray:
    """Per-layer tensors in one region: back to back, or each padded to a multiple of align=."""
    stride = g.pool_bytes // g.layers // 2  # in uint16 elements
    pool = np.zeros(stride * len(per_layer), np.uint16)
    for ly, t in enumerate(per_layer):
        pool[ly * stride:ly * stride + t.size] = t.reshape(-1)
    return pool


def _pool_and_expected(plan: kv.KvPlan) -> tuple[np.ndarray, np.ndarray]:
    """The pool's bytes built from the layout's documented shapes, and the selection by indexing."""
    g = plan.geometry
    L, P, NB, B, H = g.layers, g.parts, g.pool_blocks, g.block_tokens, g.heads
    D = g.unit // 2
    hnd = g.order == "hnd"
    layers = plan.layers
    table = plan.table
    sparse = plan.selection.kind == "sparse"
    if sparse:
        tok = plan.tokens()  # (nl, H, k)
        blk, slot = table[tok // B], tok % B
        h = np.arange(H)[:, None]
    name = g.layout.name
    if name in ("flash-attn", "flashinfer"):
        inner = (H, B, D) if hnd else (B, H, D)
        shape = (P, NB, *inner) if name == "flash-attn" else (NB, P, *inner)
        per_layer = [_values(shape, seed=ly) for ly in range(L)]
        pool = _place(per_layer, g)
        if not sparse:
            pick = (lambda t: t[:, table]) if name == "flash-attn" else (lambda t: t[table])
            return pool, np.stack([pick(per_layer[ly]) for ly in layers])
        out = []
        for li, ly in enumerate(layers):
            t = per_layer[ly]
            for p in range(P):
                tp = t[p] if name == "flash-attn" else t[:, p]
                out.append(tp[blk[li], h, slot[li]] if hnd else tp[blk[li], slot[li], h])
        return pool, np.stack(out)
    if name == "mla":
        per_layer = [_values((NB, B, D), seed=ly) for ly in range(L)]
        pool = _place(per_layer, g)
        if not sparse:
            return pool, np.stack([per_layer[ly][table] for ly in layers])
        return pool, np.stack([per_layer[ly][blk[li], slot[li]] for li, ly in enumerate(layers)])
    if name == "cross-layer":  # vLLM: NHD (NB, L, 2, B, H, D), HND (NB, H, L, 2, B, D)
        t = _values((NB, H, L, P, B, D) if hnd else (NB, L, P, B, H, D), seed=7)
        if not sparse:
            return t.reshape(-1), (t[table][:, :, layers] if hnd else t[table][:, layers])
        out = [t[blk[li], h, ly, p, slot[li]] if hnd else t[blk[li], ly, p, slot[li], h]
               for li, ly in enumerate(layers) for p in range(P)]
        return t.reshape(-1), np.stack(out)
    assert name == "lmcache"
    t = _values((NB, P, L, B, H * D), seed=9)
    if not sparse:
        return t.reshape(-1), t[table][:, :, layers]
    t6 = t.reshape(NB, P, L, B, H, D)
    out = [t6[blk[li], p, ly, slot[li], h] for li, ly in enumerate(layers) for p in range(P)]
    return t.reshape(-1), np.stack(out)


def _gather(pool: np.ndarray, frags: np.ndarray) -> np.ndarray:
    src = pool.view(np.uint8)
    total = int(frags[:, 2].sum())
    dst = np.zeros(total, np.uint8)
    for s, d, n in frags:
        dst[d:d + n] = src[s:s + n]
    return dst


GQA_CASES = [
    ("flash-attn", "dense"), ("flash-attn", "dense:3:blocks=scattered:seed=5"),
    ("flash-attn", "dense:4:order=hnd"), ("flash-attn", "superblock:2:blocks=scattered:pool=40"),
    ("flash-attn", "sparse:12:ctx=64"), ("flash-attn", "sparse:12:ctx=64:order=hnd"),
    ("flash-attn", "sparse:16:ctx=96:dist=clustered:run=4:order=hnd:blocks=scattered"),
    ("flashinfer", "dense"), ("flashinfer", "dense:3:blocks=scattered:layers=1-2:tp=2"),
    ("flashinfer", "sparse:10:ctx=48:order=hnd:layers=1"), ("flashinfer", "sparse:7:ctx=40:bt=8"),
    ("flashinfer", "dense:4:pool=4"), ("flash-attn", "dense:4:pool=4:order=hnd"),
    ("flash-attn", "dense:3:pool=3:align=4KiB"), ("flashinfer", "sparse:10:ctx=48:align=1KiB"),
    ("flash-attn", "dense:2:blocks=scattered:order=hnd:align=64KiB:layers=1-2"),
    ("cross-layer", "dense"), ("cross-layer", "dense:3:blocks=scattered:layers=0-1"),
    ("cross-layer", "sparse:9:ctx=64:order=hnd:tp=4"), ("cross-layer", "dense:2:order=hnd"),
    ("cross-layer", "dense:3:order=hnd:layers=1-2:blocks=scattered"),
    ("cross-layer", "sparse:12:ctx=64:order=hnd:layers=0-1:blocks=scattered"),
    ("lmcache", "dense:bt=16"), ("lmcache", "dense:2:blocks=scattered:bt=32:layers=1-2"),
    ("lmcache", "sparse:20:ctx=64:bt=32:dist=clustered:run=4"),
]
MLA_CASES = [
    ("mla", "dense:bt=16"), ("mla", "dense:3:blocks=scattered"), ("mla", "sparse:30:ctx=256"),
    ("mla", "dense:2:pool=3:align=16KiB"),
    ("mla", "sparse:32:ctx=256:dist=clustered:tp=8"), ("cross-layer", "dense:2"),
    ("lmcache", "sparse:8:ctx=64:bt=32"),
]


@pytest.mark.parametrize(("model", "layout", "rest"), [*[("gqa", *c) for c in GQA_CASES],
                                                        *[("mla", *c) for c in MLA_CASES]])
def test_gather_equals_numpy_selection(tiny, model, layout, rest):
    text = f"kv:{tiny[model]}:{layout}:{rest}"
    plan = kv.parse_plan(text)
    pattern = kv.parse_kv_pattern(text)
    pool, expected = _pool_and_expected(plan)
    frags = pattern.frags
    # packed locally, in order, no overlaps
    assert (frags[:, 1] == np.concatenate([[0], np.cumsum(frags[:-1, 2])])).all()
    assert pattern.total_bytes == expected.nbytes
    assert pattern.src_span <= pool.nbytes
    np.testing.assert_array_equal(_gather(pool, frags), expected.reshape(-1).view(np.uint8))
    # adjacent runs are merged within a tensor, never across: vLLM's per-layer tensors are
    # separate allocations, back to back in the region
    g = plan.geometry
    adjacent = np.flatnonzero(frags[1:, 0] == frags[:-1, 0] + frags[:-1, 2]) + 1
    if g.layout.per_layer:
        layer_bytes = g.pool_bytes // g.layers  # the layer stride
        assert (frags[adjacent, 0] % layer_bytes == 0).all()
        assert ((frags[:, 0] // layer_bytes) == (frags[:, 0] + frags[:, 2] - 1) // layer_bytes).all()
    else:
        assert adjacent.size == 0
    assert pattern.axes["fragment_count"] == pattern.count <= pattern.axes["pieces"]


def test_gather_through_the_cpu_memcpy_kernel(tiny):
    text = f"kv:{tiny['gqa']}:flash-attn:sparse:12:ctx=64:order=hnd:blocks=scattered"
    plan, pattern = kv.parse_plan(text), kv.parse_kv_pattern(text)
    pool, expected = _pool_and_expected(plan)
    dst = np.zeros(pattern.total_bytes, np.uint8)
    samples, sink = np.zeros(1, np.uint64), np.zeros(1, np.uint64)
    cpu.time_memcpy(pool.view(np.uint8), dst, pattern.frags, samples, sink)
    np.testing.assert_array_equal(dst, expected.reshape(-1).view(np.uint8))


def test_known_counts_qwen25_32b():
    fa = kv.parse_kv_pattern("kv:qwen2.5-32b:flash-attn:dense")
    assert fa.count == 128 and set(fa.frags[:, 2]) == {32 * 1024}
    fi = kv.parse_kv_pattern("kv:qwen2.5-32b:flashinfer:dense")
    assert fi.count == 64 and set(fi.frags[:, 2]) == {64 * 1024}
    assert fa.total_bytes == fi.total_bytes == 64 * 2 * 16 * 8 * 128 * 2
    assert fa.axes["rdma_work_requests"] == 5 and fi.axes["rdma_work_requests"] == 3
    cross = kv.parse_kv_pattern("kv:qwen2.5-32b:cross-layer:dense")
    assert cross.count == 1 and cross.total_bytes == fa.total_bytes
    tp2 = kv.parse_kv_pattern("kv:qwen2.5-32b:flash-attn:dense:tp=2")
    assert tp2.count == 128 and tp2.fragment_bytes == 16 * 1024
    fp8 = kv.parse_kv_pattern("kv:qwen2.5-32b:flash-attn:dense:dtype=fp8")
    assert fp8.fragment_bytes == 16 * 1024
    mla = kv.parse_kv_pattern("kv:deepseek-v3:mla:dense:bt=64")
    assert mla.count == 61 and mla.fragment_bytes == 64 * 576 * 2
    contiguous = kv.parse_kv_pattern("kv:qwen2.5-32b:flash-attn:dense:4")
    assert contiguous.count == 128 and contiguous.fragment_bytes == 4 * 32 * 1024
    assert contiguous.axes["contiguity"] == pytest.approx(0.75)
    superblock = kv.parse_kv_pattern("kv:qwen2.5-32b:flash-attn:superblock")
    assert superblock.count == 128 and superblock.fragment_bytes == 16 * 32 * 1024
    sparse = kv.parse_kv_pattern("kv:qwen2.5-32b:flash-attn:sparse:256:layers=0:ctx=1024")
    assert sparse.count == 2 * 8 * 256 and sparse.fragment_bytes == 256
    assert sparse.axes["contiguity"] == 0.0  # NHD: one head of consecutive tokens is strided


def test_per_layer_tensors_are_never_merged():
    """vLLM v1 allocates each layer's tensor separately: a read of every block of a 4-block pool
    is one piece per layer (K and V of a layer are adjacent inside its tensor), not one 16 MiB
    fragment."""
    whole = kv.parse_kv_pattern("kv:qwen2.5-32b:flash-attn:dense:4:pool=4")
    assert whole.count == 64 and set(whole.frags[:, 2]) == {2 * 4 * 32 * 1024}
    assert whole.axes["kv_tensors"] == 64 and whole.axes["layout_side"] == "region"
    assert whole.axes["contiguity"] == pytest.approx(1 - 64 / 512)
    fi = kv.parse_kv_pattern("kv:qwen2.5-32b:flashinfer:dense:4:pool=4")
    assert fi.count == 64
    aligned = kv.parse_kv_pattern("kv:qwen2.5-32b:flash-attn:dense:4:pool=4:tp=8:align=2MiB")
    assert aligned.count == 64 and (aligned.frags[:, 0] % (2 << 20) == 0).all()
    assert aligned.axes["pool_bytes"] == 64 * (2 << 20)
    cross = kv.parse_kv_pattern("kv:qwen2.5-32b:cross-layer:dense:4:pool=4")
    assert cross.count == 1 and cross.axes["kv_tensors"] == 1  # one tensor for all layers
    sparse = kv.parse_kv_pattern("kv:qwen2.5-32b:flash-attn:sparse:16:ctx=16:layers=0-1")
    assert sparse.count == 2 * 2 * 8 * 16  # NHD: one head's tokens are strided, nothing merges


def test_cross_layer_hnd_is_vllms_head_major_order():
    """vLLM's cross-layer HND is (NB, H, L, 2, B, D): a block of a layer range is one piece per
    head, and all layers of a block are still one piece."""
    full = kv.parse_kv_pattern("kv:qwen2.5-32b:cross-layer:dense:order=hnd")
    assert full.count == 1 and full.total_bytes == 64 * 2 * 16 * 8 * 128 * 2
    part = kv.parse_kv_pattern("kv:qwen2.5-32b:cross-layer:dense:order=hnd:layers=0-3")
    assert part.count == 8 and set(part.frags[:, 2]) == {4 * 2 * 16 * 128 * 2}
    nhd = kv.parse_kv_pattern("kv:qwen2.5-32b:cross-layer:dense:layers=0-3")
    assert nhd.count == 1  # NHD: layers 0-3 of a block are one run


def test_fp8_ds_mla_is_656_bytes_per_token():
    """DeepSeek-V3.2 runs on vLLM's FlashMLASparse: fp8 there is fp8_ds_mla, 656 B a token (512
    fp8 + 4 fp32 scales + 64 bf16 rope); dense MLA (DeepSeek-V3) keeps 576 B fp8."""
    ds = kv.parse_kv_pattern("kv:deepseek-v3.2:mla:dense:dtype=fp8_ds_mla")
    assert ds.count == 61 and ds.fragment_bytes == 64 * 656
    alias = kv.parse_kv_pattern("kv:deepseek-v3.2:mla:dense:dtype=fp8")  # vLLM's alias
    assert alias.fragment_bytes == 64 * 656 and alias.axes["kv_dtype"] == "fp8_ds_mla"
    fp8 = kv.parse_kv_pattern("kv:deepseek-v3:mla:dense:bt=64:dtype=fp8")
    assert fp8.fragment_bytes == 64 * 576  # plain fp8 (FlashMLA / Triton MLA): 576 B a token
    with pytest.raises(UsageError, match="dense MLA"):
        kv.parse_kv_pattern("kv:deepseek-v3:mla:dense:dtype=fp8_ds_mla")
    with pytest.raises(UsageError, match="64-token blocks"):
        kv.parse_kv_pattern("kv:deepseek-v3.2:mla:dense:bt=16")
    assert get_model("deepseek-ai/DeepSeek-V3.2-Exp").mla_sparse
    sparse = kv.parse_kv_pattern("kv:deepseek-v3.2:mla:sparse:32:ctx=256:layers=0:dtype=FP8_DS_MLA")
    assert set(sparse.frags[:, 2]) <= {656 * n for n in range(1, 33)}
    assert sparse.total_bytes == 32 * 656
    for name in ("bfloat16", "auto", "fp8_e4m3", "fp8_e5m2", "float16"):  # vLLM's spellings
        assert kv.parse_kv_pattern(f"kv:qwen2.5-32b:flash-attn:dense:dtype={name}").count == 128
    with pytest.raises(UsageError, match="fp8_ds_mla"):
        kv.parse_kv_pattern("kv:qwen2.5-32b:flash-attn:dense:dtype=fp8_ds_mla")


def test_names_are_case_insensitive():
    a = kv.parse_kv_pattern("kv:Qwen2.5-32B:Flash-Attn:DENSE:2:TP=2:Order=HND:Blocks=Scattered")
    b = kv.parse_kv_pattern("kv:qwen2.5-32b:flash-attn:dense:2:tp=2:order=hnd:blocks=scattered")
    np.testing.assert_array_equal(a.frags, b.frags)
    assert kv.parse_kv_pattern("kv:1024X160B").count == 1024
    for backend, layout in (("FLASH_ATTN", "flash-attn"), ("FLASHINFER", "flashinfer"),
                            ("FLASHMLA", "mla"), ("TRITON_MLA", "mla")):  # vLLM's backend names
        model = "deepseek-v3" if layout == "mla" else "qwen3-8b"
        assert kv.parse_kv_pattern(f"kv:{model}:{backend}:dense").axes["layout"] == layout


def test_explicit_shapes_reuse_the_core_parser():
    pattern = kv.parse_kv_pattern("kv:1024x160B")
    assert pattern.count == 1024 and pattern.fragment_bytes == 160
    assert pattern.axes["select"] == "explicit" and pattern.axes["rdma_work_requests"] == 35
    assert kv.parse_kv_pattern("kv:128x20KiB").total_bytes == 128 * 20 * 1024


def test_seeded_selections_repeat_and_differ_by_seed():
    a = kv.parse_kv_pattern("kv:qwen3-8b:flash-attn:dense:8:blocks=scattered:seed=1").frags
    b = kv.parse_kv_pattern("kv:qwen3-8b:flash-attn:dense:8:blocks=scattered:seed=1").frags
    c = kv.parse_kv_pattern("kv:qwen3-8b:flash-attn:dense:8:blocks=scattered:seed=2").frags
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_timed_metadata_builds_the_patterns_table():
    for text in ("kv:qwen2.5-32b:flash-attn:dense:3:blocks=scattered",
                 "kv:qwen2.5-32b:lmcache:dense:tp=8:layers=2-5",
                 "kv:llama-3.1-8b:flashinfer:sparse:64:ctx=512:layers=0-1:order=hnd"):
        plan, pattern = kv.parse_plan(text), kv.parse_kv_pattern(text)
        samples = np.zeros(3, np.uint64)
        out = np.zeros((pattern.axes["pieces"], 3), np.int64)
        if plan.selection.kind == "sparse":
            d = plan.geometry.sparse(plan.layers)
            n = time_sparse_metadata(plan.table, plan.tokens(), d.layer_offsets, d.tensors,
                                     d.block_stride, d.token_stride, d.head_stride, d.unit,
                                     plan.geometry.block_tokens, out, samples)
        else:
            d = plan.geometry.dense(plan.layers)
            n = time_dense_metadata(plan.table, d.outer, d.tensors, d.block_stride, d.piece,
                                    d.block_major, out, samples)
        np.testing.assert_array_equal(out[:n], pattern.frags)
        assert (samples > 0).all()


@pytest.mark.parametrize(("text", "words"), [
    ("kv:gpt-9", "unknown model"),
    ("kv:qwen2.5-32b:flash-attn:dense:tp=3", "does not divide"),
    ("kv:qwen2.5-32b:flash-attn:dense:bt=8", "not allowed by the flash-attn layout"),
    ("kv:qwen2.5-32b:flashinfer:dense:bt=12", "not allowed by the flashinfer layout"),
    ("kv:qwen2.5-32b:mla:dense", "needs an MLA model"),
    ("kv:deepseek-v3:flash-attn:dense", "uses MLA"),
    ("kv:qwen2.5-32b:lmcache:dense:order=hnd", "order"),
    ("kv:qwen2.5-32b:flash-attn:sideways", "unexpected"),
    ("kv:qwen2.5-32b:flash-attn:dense:frobs=2", "unknown kv option"),
    ("kv:qwen2.5-32b:flash-attn:dense:tp=x", "whole number"),
    ("kv:qwen2.5-32b:flash-attn:dense:8:pool=4", "raise pool"),
    ("kv:qwen2.5-32b:flash-attn:sparse:300:ctx=256", "more tokens"),
    ("kv:qwen2.5-32b:flash-attn:dense:layers=70", "outside"),
    ("kv:qwen2.5-32b:flash-attn:superblock:bt=128:pool=1", "raise pool"),
    ("kv:qwen2.5-32b:flash-attn:dense:dtype=int3", "unknown KV dtype"),
    # bounds: refused before anything is sized from them (issue 13)
    ("kv:qwen2.5-32b:flash-attn:dense:99999999999", "beyond 1048576 blocks"),
    ("kv:qwen2.5-32b:flash-attn:dense:" + "9" * 5000, "at most 18 digits"),
    ("kv:qwen2.5-32b:flash-attn:dense:\u00b2", "whole number"),
    ("kv:qwen2.5-32b:flash-attn:superblock:100000", "1600000 blocks, beyond"),
    ("kv:qwen2.5-32b:flash-attn:sparse:256:ctx=99999999999", "ctx=99999999999"),
    ("kv:qwen2.5-32b:flash-attn:sparse:256:ctx=" + "9" * 30, "at most 18 digits"),
    ("kv:qwen2.5-32b:flash-attn:sparse:8:ctx=64:dist=clustered:run=65", "run=65"),
    ("kv:qwen2.5-32b:flash-attn:sparse:2:ctx=4:dist=clustered", "run=8"),
    ("kv:qwen2.5-32b:flash-attn:sparse:8:ctx=64:run=0", "run=0"),
    ("kv:qwen2.5-32b:flash-attn:sparse:4000000:ctx=16000000", "pieces, beyond"),
    ("kv:qwen2.5-32b:flash-attn:dense:pool=99999999999999", "TiB"),
    ("kv:qwen2.5-32b:lmcache:dense:bt=999999999999984", "not allowed by the lmcache layout"),
    ("kv:qwen2.5-32b:flash-attn:dense:layers=0-99999999999999999999", "malformed layers"),
    ("kv:deepseek-v3.2:mla:dense:dtype=fp8_ds_mla:tp=0", "positive"),
    ("kv:99999999999x99999999999B", "beyond 4194304"),
    ("kv:1x70TiB", "beyond 64 TiB"),
    ("kv:qwen2.5-32b:flash-attn:dense:align=3000", "power of two"),
    ("kv:qwen2.5-32b:cross-layer:dense:align=2MiB", "one tensor"),
    ("kv:qwen2.5-32b:flash-attn:dense:align=lots", "malformed size"),
])
def test_bad_kv_patterns_are_usage_errors(text, words):
    with pytest.raises(UsageError, match=words):
        kv.parse_kv_pattern(text)


# (num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim or hidden / heads,
#  torch_dtype, kv_lora_rank, qk_rope_head_dim) from each model's Hugging Face config.json
PUBLISHED = {
    "qwen2.5-32b": (64, 40, 8, 128, "bf16", 0, 0),  # hidden 5120
    "qwen3-32b": (64, 64, 8, 128, "bf16", 0, 0),  # head_dim 128
    "qwen3-8b": (36, 32, 8, 128, "bf16", 0, 0),  # head_dim 128
    "llama-3.1-8b": (32, 32, 8, 128, "bf16", 0, 0),  # hidden 4096
    "llama-3.1-70b": (80, 64, 8, 128, "bf16", 0, 0),  # hidden 8192
    "deepseek-v3": (61, 128, 128, 128, "bf16", 512, 64),
    "deepseek-v3.2": (61, 128, 128, 128, "bf16", 512, 64),  # + index_topk 2048 (sparse)
}


def test_builtin_models_match_their_published_configs():
    assert {name: (m.layers, m.heads, m.kv_heads, m.head_dim, m.dtype, m.mla_latent, m.mla_rope)
            for name, m in BUILTIN.items()} == PUBLISHED
    q = BUILTIN["qwen2.5-32b"]
    ds = BUILTIN["deepseek-v3"]
    assert ds.is_mla and ds.layers == 61 and ds.head_bytes() == 576 * 2
    assert get_model("Qwen/Qwen2.5-32B-Instruct") is q
    assert get_model("meta-llama/Llama-3.1-70B-Instruct") is BUILTIN["llama-3.1-70b"]


def test_hf_config_loading(tmp_path, tiny):
    gqa = from_hf_config(tiny["gqa"])
    assert (gqa.layers, gqa.kv_heads, gqa.head_dim, gqa.is_mla) == (3, 4, 8, False)
    mla = from_hf_config(tiny["mla"].removesuffix("/config.json"))  # a directory works too
    assert mla.is_mla and mla.head_bytes() == 16 * 2
    wrapped = tmp_path / "vl.json"
    wrapped.write_text(json.dumps({"text_config": {
        "num_hidden_layers": 5, "num_attention_heads": 4, "head_dim": 32, "dtype": "float16"}}))
    model = from_hf_config(wrapped)
    assert (model.layers, model.kv_heads, model.head_dim, model.dtype) == (5, 4, 32, "fp16")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        from_hf_config(bad)
    with pytest.raises(UsageError, match="cannot read"):
        from_hf_config(tmp_path / "missing.json")
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    with pytest.raises(UsageError, match="num_hidden_layers"):
        from_hf_config(empty)
    for text, words in (("[1, 2]", "not a JSON object"),
                        ('{"num_hidden_layers": 2, "num_attention_heads": 0, "hidden_size": 8}',
                         "outside 1-"),
                        ('{"num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 8, '
                         '"num_key_value_heads": "two"}', "must be a positive whole number")):
        empty.write_text(text)
        with pytest.raises(UsageError, match=words):
            from_hf_config(empty)


@pytest.mark.parametrize(("body", "words"), [
    ({"num_hidden_layers": 1e12, "num_attention_heads": 8, "head_dim": 8}, "outside 1-4096"),
    ({"num_hidden_layers": 10**12, "num_attention_heads": 8, "head_dim": 8}, "outside 1-4096"),
    ({"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 10**9}, "head_dim"),
    ({"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 10**9,
      "head_dim": 8}, "num_key_value_heads"),
    ({"num_hidden_layers": 2, "num_attention_heads": 1, "hidden_size": 10**12}, "hidden_size"),
    ({"num_hidden_layers": 2.5, "num_attention_heads": 8, "head_dim": 8}, "whole number"),
    ({"num_hidden_layers": True, "num_attention_heads": 8, "head_dim": 8}, "whole number"),
    ({"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 8, "kv_lora_rank": 1e15},
     "kv_lora_rank"),
])
def test_absurd_model_configs_are_one_line_errors(tmp_path, body, words):
    """A config with 1e12 layers used to reach np.arange(1e12) (MemoryError): now bounded."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(body).replace("1e+12", "1e12"))
    with pytest.raises(UsageError, match=words):
        kv.parse_kv_pattern(f"kv:{path}:flash-attn:dense")


def test_binary_and_huge_config_files_are_usage_errors(tmp_path):
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00\x80" * 10)
    with pytest.raises(UsageError, match="not UTF-8"):
        from_hf_config(binary)
    nested = tmp_path / "deep.json"
    nested.write_text("[" * 100_000)
    with pytest.raises(UsageError, match=r"nests too deeply|not valid JSON"):
        from_hf_config(nested)


def test_size_histogram_buckets_many_sizes():
    exact = kv.size_histogram(np.array([256, 256, 512]))
    assert exact == [("256B", 2, 512), ("512B", 1, 512)]
    many = kv.size_histogram(np.arange(100, 1100, 100))
    assert sum(n for _, n, _ in many) == 10


def test_run_length_bounds_only_clustered_selections():
    """run= is the clustered run length: a uniform selection from a context shorter than the
    default run (8) is fine; a clustered one still needs its run to fit the context."""
    pattern = kv.parse_kv_pattern("kv:qwen2.5-32b:flash-attn:sparse:2:ctx=4:dist=uniform")
    assert pattern.frags.shape[0] > 0
    kv.parse_kv_pattern("kv:qwen2.5-32b:flash-attn:sparse:2:ctx=4:dist=clustered:run=2")
    with pytest.raises(UsageError, match="run=8"):
        kv.parse_kv_pattern("kv:qwen2.5-32b:flash-attn:sparse:2:ctx=4:dist=clustered")
