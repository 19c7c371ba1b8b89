"""Model configurations: the few numbers that decide a KV cache's shape.

Built-in entries are copied from each model's published Hugging Face `config.json`; any other model
is read from a local `config.json` (a file or a directory holding one; never the network).
GQA models store `kv_heads` K and V heads of `head_dim` per token per layer; MLA models
(DeepSeek-V3) store one compressed latent of `kv_lora_rank + qk_rope_head_dim` (512 + 64) per token
per layer, shared by all heads, so tensor parallelism replicates it instead of dividing it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from nearlocal.errors import UsageError

# bytes per element of the KV cache dtypes vLLM offers (fp8 = e4m3 / e5m2)
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
_HF_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32",
              "float": "fp32", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}


@dataclass(frozen=True)
class ModelConfig:
    """What the KV cache of one model looks like before tensor parallelism."""

    name: str
    layers: int
    heads: int  # attention (query) heads
    kv_heads: int  # K/V heads (GQA); for MLA the config's value, unused by the cache
    head_dim: int
    dtype: str = "bf16"
    mla_latent: int = 0  # MLA: kv_lora_rank (512 for DeepSeek-V3); 0 for GQA/MHA
    mla_rope: int = 0  # MLA: qk_rope_head_dim (64 for DeepSeek-V3)

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
        width = self.mla_latent + self.mla_rope if self.is_mla else self.head_dim
        return width * DTYPE_BYTES[dtype or self.dtype]


BUILTIN: dict[str, ModelConfig] = {m.name: m for m in (
    ModelConfig("qwen2.5-32b", layers=64, heads=40, kv_heads=8, head_dim=128),
    ModelConfig("qwen3-32b", layers=64, heads=64, kv_heads=8, head_dim=128),
    ModelConfig("qwen3-8b", layers=36, heads=32, kv_heads=8, head_dim=128),
    ModelConfig("llama-3.1-8b", layers=32, heads=32, kv_heads=8, head_dim=128),
    ModelConfig("llama-3.1-70b", layers=80, heads=64, kv_heads=8, head_dim=128),
    ModelConfig("deepseek-v3", layers=61, heads=128, kv_heads=128, head_dim=128,
                mla_latent=512, mla_rope=64),
)}


def _canonical(name: str) -> str:
    """`Qwen/Qwen2.5-32B-Instruct` and `qwen2.5-32b` name the same cache."""
    key = name.strip().lower().rsplit("/", 1)[-1]
    for suffix in ("-instruct", "-chat", "-base"):
        key = key.removesuffix(suffix)
    return key.replace("meta-llama-", "llama-")


def from_hf_config(path: str | Path) -> ModelConfig:
    """A ModelConfig from a local Hugging Face config.json (file or directory), no network."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read model config {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"model config {path} is not valid JSON: {exc.msg} "
                         f"(line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise UsageError(f"model config {path} is not a JSON object: is it a transformer's "
                         "config.json?")
    if isinstance(data.get("text_config"), dict):  # multimodal wrappers keep the LM inside
        data = {**data, **data["text_config"]}
    try:
        layers = int(data["num_hidden_layers"])
        heads = int(data["num_attention_heads"])
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"model config {path} lacks num_hidden_layers / num_attention_heads: "
                         "is it a transformer's config.json?") from None
    if not data.get("head_dim") and "hidden_size" not in data:
        raise UsageError(f"model config {path} has neither head_dim nor hidden_size")
    try:
        kv_heads = int(data.get("num_key_value_heads") or heads)
        head_dim = int(data.get("head_dim") or int(data["hidden_size"]) // heads)
        latent = int(data.get("kv_lora_rank") or 0)
        rope = int(data.get("qk_rope_head_dim") or 0) if latent else 0
    except (TypeError, ValueError, ZeroDivisionError):
        kv_heads = head_dim = 0
    if min(layers, heads, kv_heads, head_dim) <= 0 or min(latent, rope) < 0:  # (0 when unparsable)
        raise UsageError(f"model config {path}: layers, heads, KV heads, head_dim and the MLA "
                         "widths must be positive whole numbers")
    dtype_text = str(data.get("torch_dtype") or data.get("dtype") or "bfloat16")
    dtype = _HF_DTYPES.get(dtype_text.removeprefix("torch."), "bf16")
    name = path.parent.name or path.stem
    return ModelConfig(name, layers, heads, kv_heads, head_dim, dtype, latent, rope)


def get_model(name: str) -> ModelConfig:
    """A built-in model by name (case-insensitive), or a path to a local config.json."""
    text = str(name).strip()
    if text.endswith(".json") or ("/" in text and Path(text).exists()):
        return from_hf_config(text)
    key = _canonical(text)
    if key in BUILTIN:
        return BUILTIN[key]
    raise UsageError(f"unknown model {name!r}: built-in models are {', '.join(BUILTIN)}, "
                     "or give the path of a local Hugging Face config.json")
