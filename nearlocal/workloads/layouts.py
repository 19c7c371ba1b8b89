"""KV-cache layouts: where each (layer, K/V, block, token, head) lives, as strides.

Checked against vLLM's v1 attention backends (get_kv_cache_shape / get_kv_cache_stride_order).
vLLM v1 allocates every layer's KV tensor on its own (one torch.zeros per layer), so a transfer
moves at least one piece per layer tensor: no fragment here ever spans two tensors, even where the
region places them back to back. Shapes as laid out in memory, H = KV heads per rank,
D = head_dim, NB = blocks, B = tokens per block, L = layers:

| name | tensors | memory order | one block of one layer is |
|---|---|---|---|
| flash-attn | one per layer | (2, NB, B, H, D) NHD, (2, NB, H, B, D) HND | K, V apart: 2 pieces |
| flashinfer | one per layer | (NB, 2, B, H, D) NHD, (NB, 2, H, B, D) HND | K then V: 1 piece |
| mla | one per layer | (NB, B, 576 x dtype), or (NB, B, 656 B) for fp8_ds_mla | 1 piece |
| cross-layer | one for all layers | (NB, L, 2, B, H, D) NHD, (NB, H, L, 2, B, D) HND | all layers: 1 |
| lmcache | chunks of B tokens | each chunk [2, L, B, H * D] (LMCache's KV_2LTD) | 1 per chunk |

cross-layer is vLLM's FlashAttention layout with the layers dimension (kv_connector's cross-layer
blocks, stride orders (2, 0, 1, 3, 4, 5) NHD and (2, 4, 0, 1, 3, 5) HND). MLA models use 1 instead of
2 K/V parts and the latent in every layout.

Which side is which: the region (read from in a gather, written in a scatter) holds this layout,
its tensors back to back in one mapping (or each on a multiple of align=, e.g. 2MiB as the CUDA
caching allocator rounds large tensors); the local buffer or peer holds the same bytes packed, in
the order a connector copies them into a contiguous pool slot. A layout reduces to two descriptors
the fragment builders (selections.py) consume: `dense()` for whole blocks and `sparse()` for single
(token, head) pieces; both carry the tensor each piece belongs to, so merging stops at a tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

from nearlocal.core.patterns import MAX_SPAN  # a pool's bytes: 64 TiB, past any (Beluga's is 8 TB)
from nearlocal.errors import UsageError
from nearlocal.lazy import lazy_import
from nearlocal.workloads.llm_configs import FP8_DS_MLA, KV_DTYPES, LLMConfig

np = lazy_import("numpy")

VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
MAX_CHUNK_TOKENS = 1 << 16  # LMCache chunks (256 by default); beyond is a typo
MAX_LAYER_ALIGN = 1 << 30


@dataclass(frozen=True)
class LayoutKind:
    name: str
    summary: str
    default_block_tokens: int
    block_rule: str  # said in the error when a block size is refused
    allows: tuple[int, ...] | None  # explicit block sizes, or None: multiples of 16
    orders: tuple[str, ...] = ("nhd", "hnd")
    mla: str = "any"  # "any", "only" (needs an MLA model) or "never"
    per_layer: bool = True  # one tensor (allocation) per layer, as vLLM v1 allocates

    def check_block_tokens(self, tokens: int) -> None:
        ok = (tokens in self.allows if self.allows is not None
              else 0 < tokens <= MAX_CHUNK_TOKENS and tokens % 16 == 0)
        if not ok:
            raise UsageError(f"block size {tokens} tokens is not allowed by the {self.name} layout: "
                             f"{self.block_rule}")


LAYOUTS: dict[str, LayoutKind] = {k.name: k for k in (
    LayoutKind("flash-attn", "vLLM FlashAttention: one tensor per layer (2, blocks, B, H, D), K "
               "and V apart",
               16, "FlashAttention needs a multiple of 16 up to 128 (16, 32, 64, 128)",
               (16, 32, 64, 128)),
    LayoutKind("flashinfer", "vLLM FlashInfer: one tensor per layer (blocks, 2, B, H, D), K then V "
               "per block",
               16, f"vLLM block sizes are {', '.join(map(str, VLLM_BLOCK_SIZES))}",
               VLLM_BLOCK_SIZES),
    LayoutKind("mla", "vLLM MLA latent cache: one tensor per layer (blocks, B, 512 + 64)", 64,
               "MLA backends take 16, 32, 64 (FlashMLA's) or 128", (16, 32, 64, 128),
               orders=("nhd",), mla="only"),
    LayoutKind("cross-layer", "vLLM cross-layer blocks: one tensor (blocks, layers, 2, B, H, D) NHD "
               "or (blocks, H, layers, 2, B, D) HND", 16,
               f"vLLM block sizes are {', '.join(map(str, VLLM_BLOCK_SIZES))}", VLLM_BLOCK_SIZES,
               per_layer=False),
    LayoutKind("lmcache", "LMCache chunks of B tokens (default 256), each [2, layers, B, H*D]", 256,
               f"LMCache chunks are a positive multiple of 16 tokens up to {MAX_CHUNK_TOKENS} "
               "(256 by default)", None, orders=("nhd",), per_layer=False),
)}


# vLLM's backend names (VLLM_ATTENTION_BACKEND / --attention-backend) -> the layout they allocate
VLLM_BACKENDS = {"flash_attn": "flash-attn", "flashinfer": "flashinfer", "flashmla": "mla",
                 "flashmla_sparse": "mla", "triton_mla": "mla", "cutlass_mla": "mla",
                 "flashinfer_mla": "mla"}


def layout_key(name: str) -> str | None:
    """Our layout name for ours or a vLLM backend name (any case), or None."""
    key = name.strip().lower()
    key = VLLM_BACKENDS.get(key, key)
    return key if key in LAYOUTS else None


def get_layout(name: str) -> LayoutKind:
    key = layout_key(name)
    if key is None:
        raise UsageError(f"unknown layout {name!r}: valid layouts are {', '.join(LAYOUTS)} (or "
                         f"vLLM's backend names {', '.join(VLLM_BACKENDS)})")
    return LAYOUTS[key]


@dataclass(frozen=True)
class DenseDescriptor:
    """Whole-block pieces: piece o of block b starts at outer[o] + b * block_stride."""

    outer: np.ndarray  # int64, in the order the local buffer holds them
    block_stride: int
    piece: int
    block_major: bool  # local order (block, piece) instead of (piece, block)
    tensors: np.ndarray  # int64, the tensor (allocation) each outer piece lies in


@dataclass(frozen=True)
class SparseDescriptor:
    """(token, head) pieces: layer_offsets[l, p] + block * block_stride + slot * token_stride
    + head * head_stride, `unit` bytes long; local order (layer, part, head, token)."""

    layer_offsets: np.ndarray  # int64 (selected layers, parts)
    block_stride: int
    token_stride: int
    head_stride: int
    unit: int
    heads: int
    tensors: np.ndarray  # int64 (selected layers,): the tensor each layer's pieces lie in


@dataclass(frozen=True)
class KvGeometry:
    """One rank's pool: a model, its layout and the numbers that size it."""

    model: LLMConfig
    layout: LayoutKind
    tp: int
    block_tokens: int
    dtype: str
    order: str
    pool_blocks: int
    layer_align: int = 0  # per-layer tensors start on a multiple of this (0: back to back)

    def __post_init__(self) -> None:
        layout = self.layout
        if layout.mla == "only" and not self.model.is_mla:
            raise UsageError(f"layout mla needs an MLA model (deepseek-v3, deepseek-v3.2); "
                             f"{self.model.name} uses GQA: use flash-attn, flashinfer, cross-layer "
                             "or lmcache")
        if self.model.is_mla and layout.name in ("flash-attn", "flashinfer"):
            raise UsageError(f"{self.model.name} uses MLA (one 576-wide latent per token): use "
                             "--layout mla, cross-layer or lmcache")
        if self.dtype not in KV_DTYPES:
            raise UsageError(f"unknown KV dtype {self.dtype!r}: valid are {', '.join(KV_DTYPES)}")
        if self.dtype == FP8_DS_MLA:
            self.model.check_fp8_ds_mla()
        if self.model.mla_sparse and layout.name == "mla" and self.block_tokens != 64:
            raise UsageError(f"{self.model.name} runs on vLLM's FlashMLASparse, which takes "
                             f"64-token blocks, not {self.block_tokens}")
        if self.order not in layout.orders:
            raise UsageError(f"order {self.order!r} is not valid for layout {layout.name}: valid "
                             f"are {', '.join(layout.orders)}")
        layout.check_block_tokens(self.block_tokens)
        self.model.kv_heads_per_rank(self.tp)  # raises when TP does not divide the KV heads
        if self.pool_blocks <= 0:
            raise UsageError(f"the pool needs at least one block, got {self.pool_blocks}")
        if self.pool_blocks > MAX_SPAN // self.block_bytes:
            raise UsageError(f"pool={self.pool_blocks} blocks of {self.block_bytes} B is beyond "
                             f"{MAX_SPAN >> 40} TiB: lower pool= (or the selection)")
        if self.layer_align:
            align = self.layer_align
            if not layout.per_layer:
                raise UsageError(f"align= places per-layer tensors; layout {layout.name} holds "
                                 "one tensor")
            if align < 64 or align > MAX_LAYER_ALIGN or align & (align - 1):
                raise UsageError(f"align={align} must be a power of two from 64 B to "
                                 f"{MAX_LAYER_ALIGN >> 30} GiB (2MiB: the CUDA caching "
                                 "allocator's rounding of large tensors)")
            if self.pool_bytes > MAX_SPAN:
                raise UsageError(f"pool={self.pool_blocks} blocks with align={align} is beyond "
                                 f"{MAX_SPAN >> 40} TiB: lower pool= or align=")

    # --- sizes --------------------------------------------------------------------------------
    @property
    def heads(self) -> int:
        return self.model.kv_heads_per_rank(self.tp)

    @property
    def parts(self) -> int:
        return self.model.kv_parts

    @property
    def unit(self) -> int:
        """One head of one token of one layer (K or V), or one MLA latent."""
        return self.model.head_bytes(self.dtype)

    @property
    def token_bytes(self) -> int:
        return self.heads * self.unit

    @property
    def part_block_bytes(self) -> int:
        """One block of K (or V, or latent) of one layer."""
        return self.block_tokens * self.token_bytes

    @property
    def layers(self) -> int:
        return self.model.layers

    @property
    def block_bytes(self) -> int:
        """Every layer's K and V of one block."""
        return self.layers * self.parts * self.part_block_bytes

    @property
    def pool_bytes(self) -> int:
        """The region the layout occupies (per-layer tensors padded to align=, if given)."""
        if self.layout.per_layer:
            return self.layers * self._layer_stride
        return self.pool_blocks * self.block_bytes

    @property
    def tensors(self) -> int:
        """Separate tensors (allocations) the layout side holds: one per layer, or one."""
        return self.layers if self.layout.per_layer else 1

    @property
    def _layer_bytes(self) -> int:
        """One layer's tensor (per-layer layouts)."""
        return self.pool_blocks * self.parts * self.part_block_bytes

    @property
    def _layer_stride(self) -> int:
        """Where layer l's tensor starts: l * this (back to back, or rounded up to align=)."""
        align = self.layer_align or 1
        return -(-self._layer_bytes // align) * align

    @property
    def _cross_hnd(self) -> bool:
        return self.layout.name == "cross-layer" and self.order == "hnd"

    def _strides(self) -> tuple[int, int]:
        """(token stride, head stride) inside one block of one part."""
        if self._cross_hnd:  # (NB, H, L, 2, B, D): a head holds every layer's K and V
            return self.unit, self.layers * self.parts * self.block_tokens * self.unit
        if self.order == "hnd":
            return self.unit, self.block_tokens * self.unit
        return self.token_bytes, self.unit

    def _part_offsets(self, layers: np.ndarray) -> tuple[np.ndarray, int]:
        """Offset of part p of layer l in block 0 (head 0, token 0), and the block stride."""
        nb, parts, pb = self.pool_blocks, self.parts, self.part_block_bytes
        parts_idx = np.arange(parts, dtype=np.int64)
        lay = layers.astype(np.int64)[:, None]
        name = self.layout.name
        if name == "flash-attn":
            return lay * self._layer_stride + parts_idx * nb * pb, pb
        if name in ("flashinfer", "mla"):
            return lay * self._layer_stride + parts_idx * pb, parts * pb
        if self._cross_hnd:
            return (lay * parts + parts_idx) * self.block_tokens * self.unit, self.block_bytes
        if name == "cross-layer":
            return (lay * parts + parts_idx) * pb, self.block_bytes
        # lmcache: [parts, layers, tokens, hidden]
        return parts_idx * self.layers * pb + lay * pb, self.block_bytes

    def _tensor_of(self, layers: np.ndarray) -> np.ndarray:
        if self.layout.per_layer:
            return layers.astype(np.int64)
        return np.zeros(layers.size, np.int64)

    def check_layers(self, layers: np.ndarray) -> None:
        if layers.size == 0 or layers.min() < 0 or layers.max() >= self.layers:
            raise UsageError(f"layers must lie in 0-{self.layers - 1} for {self.model.name}")

    # --- descriptors ------------------------------------------------------------------------
    def dense(self, layers: np.ndarray) -> DenseDescriptor:
        self.check_layers(layers)
        offsets, stride = self._part_offsets(layers)
        tensors = self._tensor_of(layers)
        name = self.layout.name
        if name in ("flashinfer", "mla"):  # K and V (or the latent) of a block sit together
            return DenseDescriptor(np.ascontiguousarray(offsets[:, 0]), stride,
                                   self.parts * self.part_block_bytes, False, tensors)
        if name == "lmcache":  # local order inside a chunk: (part, layer)
            return DenseDescriptor(np.ascontiguousarray(offsets.T.reshape(-1)), stride,
                                   self.part_block_bytes, True,
                                   np.zeros(offsets.size, np.int64))
        if self._cross_hnd:  # local order inside a block: (head, layer, part), B tokens each
            _, head_stride = self._strides()
            heads = np.arange(self.heads, dtype=np.int64)[:, None] * head_stride
            outer = (heads + offsets.reshape(-1)[None, :]).reshape(-1)
            return DenseDescriptor(outer, stride, self.block_tokens * self.unit, True,
                                   np.zeros(outer.size, np.int64))
        return DenseDescriptor(offsets.reshape(-1), stride, self.part_block_bytes,
                               name == "cross-layer", np.repeat(tensors, self.parts))

    def sparse(self, layers: np.ndarray) -> SparseDescriptor:
        self.check_layers(layers)
        offsets, stride = self._part_offsets(layers)
        token_stride, head_stride = self._strides()
        return SparseDescriptor(np.ascontiguousarray(offsets), stride, token_stride, head_stride,
                                self.unit, self.heads, self._tensor_of(layers))
