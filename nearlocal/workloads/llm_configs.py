"""Model configurations: the few numbers that decide a KV cache's shape.

Built-in entries are copied from each model's published Hugging Face `config.json`; any other model
is read from a local `config.json` (a file or a directory holding one; never the network).
GQA models store `kv_heads` K and V heads of `head_dim` per token per layer; MLA models
(DeepSeek-V3) store one compressed latent of `kv_lora_rank + qk_rope_head_dim` (512 + 64) per token
per layer, shared by all heads, so tensor parallelism replicates it instead of dividing it.

KV dtypes take vLLM's `--kv-cache-dtype` names too (auto, bfloat16, float16, fp8, fp8_e4m3,
fp8_e5m2, fp8_ds_mla). `fp8_ds_mla` is DeepSeek's sparse-FlashMLA record (vLLM's FlashMLASparse
backend): 512 fp8 latent values, 4 fp32 scales and the 64 rope values kept in bf16 = 656 B per
token per layer, not the 576 B plain fp8 gives.

A config read from a file is bounded (layers, heads, head_dim) before anything is sized from it:
a typo like 1e12 layers is a one-line error, not a MemoryError.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from nearlocal.errors import UsageError

# bytes per element of the KV cache dtypes vLLM offers (fp8 = e4m3 / e5m2); fp8_ds_mla is a
# per-token record, not an element type (FP8_DS_MLA_TOKEN_BYTES)
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
FP8_DS_MLA = "fp8_ds_mla"
FP8_DS_MLA_TOKEN_BYTES = 656  # 512 x fp8 latent + 4 x fp32 scale + 64 x bf16 rope
FP8_DS_MLA_WIDTHS = (512, 64)  # the (kv_lora_rank, qk_rope_head_dim) the record is defined for
KV_DTYPES = (*DTYPE_BYTES, FP8_DS_MLA)
# vLLM's --kv-cache-dtype spellings -> ours ("auto" is the model's dtype)
# torch's dtype names, as both a config.json's torch_dtype and vLLM's --kv-cache-dtype spell them;
# the two differ only in the fp8 names
_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32",
                 "float": "fp32"}
_VLLM_DTYPES = {**_TORCH_DTYPES, "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}
# Bounds on what a config file may say (the largest published models are far inside them):
# beyond these a value is a typo, and sizing arrays from it would exhaust memory.
MAX_LAYERS = 4096
MAX_HEADS = 65536
MAX_HEAD_DIM = 65536
MAX_CONFIG_BYTES = 16 << 20
_HF_DTYPES = {**_TORCH_DTYPES, "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}


@dataclass(frozen=True)
class LLMConfig:
    """What the KV cache of one model looks like before tensor parallelism."""

    name: str
    layers: int
    heads: int  # attention (query) heads
    kv_heads: int  # K/V heads (GQA); for MLA the config's value, unused by the cache
    head_dim: int
    dtype: str = "bf16"
    mla_latent: int = 0  # MLA: kv_lora_rank (512 for DeepSeek-V3); 0 for GQA/MHA
    mla_rope: int = 0  # MLA: qk_rope_head_dim (64 for DeepSeek-V3)
    mla_sparse: bool = False  # DeepSeek sparse attention (config has index_topk): vLLM runs it on
    # FlashMLASparse, whose fp8 cache is fp8_ds_mla (656 B a token) in 64-token blocks

    @property
    def is_mla(self) -> bool:
        return self.mla_latent > 0

    @property
    def kv_parts(self) -> int:
        """Separate K and V tensors (2), or one MLA latent (1)."""
        return 1 if self.is_mla else 2

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads one tensor-parallel rank holds; MLA's latent is replicated (one 'head')."""
        if tp <= 0:
            raise UsageError(f"tensor parallelism must be a positive integer, got {tp}")
        if self.is_mla:
            return 1
        if self.kv_heads % tp:
            divisors = [d for d in range(1, self.kv_heads + 1) if self.kv_heads % d == 0]
            raise UsageError(f"TP {tp} does not divide {self.name}'s {self.kv_heads} KV heads: "
                             f"valid TP sizes are {', '.join(map(str, divisors))}")
        return self.kv_heads // tp

    def head_bytes(self, dtype: str | None = None) -> int:
        """Bytes of one head (or the whole MLA latent) of one token in one layer."""
        dtype = dtype or self.dtype
        if dtype == FP8_DS_MLA:
            self.check_fp8_ds_mla()
            return FP8_DS_MLA_TOKEN_BYTES
        width = self.mla_latent + self.mla_rope if self.is_mla else self.head_dim
        return width * DTYPE_BYTES[dtype]

    def check_fp8_ds_mla(self) -> None:
        """fp8_ds_mla is the sparse-FlashMLA record of DeepSeek's 512 + 64 latent (vLLM: head
        size 576); vLLM's other MLA backends do not take it."""
        if not self.mla_sparse or (self.mla_latent, self.mla_rope) != FP8_DS_MLA_WIDTHS:
            raise UsageError(f"KV dtype fp8_ds_mla is the sparse FlashMLA record of DeepSeek-V3.2 "
                             f"(latent 512 + rope 64, 656 B a token); {self.name} "
                             + ("uses GQA" if not self.is_mla else
                                "uses dense MLA (no index_topk): its fp8 is 576 B a token"
                                if not self.mla_sparse else
                                f"has latent {self.mla_latent} + rope {self.mla_rope}")
                             + ": use fp8, bf16, fp16 or fp32")


def kv_dtype(text: str | None, model: LLMConfig) -> str:
    """Our dtype name for `text` (ours or vLLM's --kv-cache-dtype spelling; None/auto: the
    model's)."""
    key = (text or "auto").strip().lower()
    if key == "auto":
        return model.dtype
    key = _VLLM_DTYPES.get(key, key)
    if key == "fp8" and model.mla_sparse:  # vLLM's FlashMLASparse takes fp8 as fp8_ds_mla
        key = FP8_DS_MLA
    if key not in KV_DTYPES:
        raise UsageError(f"unknown KV dtype {text!r}: valid are {', '.join(KV_DTYPES)}, auto, "
                         f"or vLLM's {', '.join(_VLLM_DTYPES)}")
    if key == FP8_DS_MLA:
        model.check_fp8_ds_mla()
    return key


BUILTIN: dict[str, LLMConfig] = {m.name: m for m in (
    LLMConfig("qwen2.5-32b", layers=64, heads=40, kv_heads=8, head_dim=128),
    LLMConfig("qwen3-32b", layers=64, heads=64, kv_heads=8, head_dim=128),
    LLMConfig("qwen3-8b", layers=36, heads=32, kv_heads=8, head_dim=128),
    LLMConfig("llama-3.1-8b", layers=32, heads=32, kv_heads=8, head_dim=128),
    LLMConfig("llama-3.1-70b", layers=80, heads=64, kv_heads=8, head_dim=128),
    LLMConfig("deepseek-v3", layers=61, heads=128, kv_heads=128, head_dim=128,
                mla_latent=512, mla_rope=64),
    LLMConfig("deepseek-v3.2", layers=61, heads=128, kv_heads=128, head_dim=128,
                mla_latent=512, mla_rope=64, mla_sparse=True),
)}


def _canonical(name: str) -> str:
    """`Qwen/Qwen2.5-32B-Instruct` and `qwen2.5-32b` name the same cache."""
    key = name.strip().lower().rsplit("/", 1)[-1]
    for suffix in ("-instruct", "-chat", "-base", "-exp"):
        key = key.removesuffix(suffix)
    return key.replace("meta-llama-", "llama-")


def _whole(data: dict, key: str, path: Path, limit: int) -> int:
    """data[key] as a whole number in 1..limit, or a one-line error naming the key."""
    value = data[key]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        value = int(value)
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit() \
            and len(value.strip()) <= 18:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"model config {path}: {key} must be a positive whole number, "
                         f"got {value!r:.40}")
    if not 0 < value <= limit:
        raise UsageError(f"model config {path}: {key} = {value} is outside 1-{limit}: "
                         "not a model this tool can size")
    return value


def from_hf_config(path: str | Path) -> LLMConfig:
    """A LLMConfig from a local Hugging Face config.json (file or directory), no network."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    from nearlocal import safeio

    # bounded: a FIFO, a device or a huge file is not a config (one line, never a hang)
    raw = safeio.read_input(path, "model config", MAX_CONFIG_BYTES)
    try:
        data = safeio.parse_nested(json.loads, raw.decode())
    except safeio.TooDeep:
        raise UsageError(f"model config {path} nests too deeply to be a config.json") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"model config {path} is not valid JSON: {exc.msg} "
                         f"(line {exc.lineno})") from None
    except UnicodeDecodeError:
        raise UsageError(f"model config {path} is not UTF-8 text: is it a config.json?") from None
    except RecursionError:
        raise UsageError(f"model config {path} nests too deeply to be a config.json") from None
    if not isinstance(data, dict):
        raise UsageError(f"model config {path} is not a JSON object: is it a transformer's "
                         "config.json?")
    if isinstance(data.get("text_config"), dict):  # multimodal wrappers keep the LM inside
        data = {**data, **data["text_config"]}
    if "num_hidden_layers" not in data or "num_attention_heads" not in data:
        raise UsageError(f"model config {path} lacks num_hidden_layers / num_attention_heads: "
                         "is it a transformer's config.json?")
    if not data.get("head_dim") and "hidden_size" not in data:
        raise UsageError(f"model config {path} has neither head_dim nor hidden_size")
    layers = _whole(data, "num_hidden_layers", path, MAX_LAYERS)
    heads = _whole(data, "num_attention_heads", path, MAX_HEADS)
    kv_heads = (_whole(data, "num_key_value_heads", path, MAX_HEADS)
                if data.get("num_key_value_heads") is not None else heads)
    if data.get("head_dim"):
        head_dim = _whole(data, "head_dim", path, MAX_HEAD_DIM)
    else:
        head_dim = _whole(data, "hidden_size", path, MAX_HEAD_DIM * MAX_HEADS) // heads
        if not 0 < head_dim <= MAX_HEAD_DIM:
            raise UsageError(f"model config {path}: hidden_size / num_attention_heads gives "
                             f"head_dim {head_dim}, outside 1-{MAX_HEAD_DIM}")
    latent = _whole(data, "kv_lora_rank", path, MAX_HEAD_DIM) if data.get("kv_lora_rank") else 0
    rope = (_whole(data, "qk_rope_head_dim", path, MAX_HEAD_DIM)
            if latent and data.get("qk_rope_head_dim") else 0)
    dtype_text = str(data.get("torch_dtype") or data.get("dtype") or "bfloat16")
    dtype = _HF_DTYPES.get(dtype_text.removeprefix("torch."), "bf16")
    name = path.parent.name or path.stem
    sparse = bool(latent) and data.get("index_topk") is not None
    return LLMConfig(name, layers, heads, kv_heads, head_dim, dtype, latent, rope, sparse)


def get_model(name: str) -> LLMConfig:
    """A built-in model by name (case-insensitive), or a path to a local config.json."""
    text = str(name).strip()
    if text.endswith(".json") or ("/" in text and Path(text).exists()):
        return from_hf_config(text)
    key = _canonical(text)
    if key in BUILTIN:
        return BUILTIN[key]
    raise UsageError(f"unknown model {name!r}: built-in models are {', '.join(BUILTIN)}, "
                     "or give the path of a local Hugging Face config.json")
