"""A GGUF file's metadata as the Hugging Face style config dict that ``ModelConfig.from_dict`` takes.

llama.cpp writes a model's shape under ``{arch}.*`` keys (``llama.block_count``,
``qwen2.attention.head_count_kv`` ...); a tied head is a file without ``output.weight``; Llama 3's
rotary scaling is a ``rope_freqs.weight`` tensor of per-frequency divisors, carried here as
``rope_scaling = {"rope_type": "factors", "factors": [...]}``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from swiftlm.core.gguf_file import GGUFError, GGUFFile

# GGUF's general.architecture -> the Hugging Face architecture of the one decoder
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def gguf_config_dict(file: GGUFFile) -> dict[str, Any]:
    """The HF-style config of ``file`` (raises GGUFError for an architecture swiftlm does not run)."""
    arch = file.architecture
    if arch not in GGUF_ARCHITECTURES:
        raise GGUFError(f"{file.path}: GGUF architecture {arch!r} is not supported; swiftlm runs "
                        f"{', '.join(GGUF_ARCHITECTURES)}")

    def need(key: str) -> Any:
        value = file.get(f"{arch}.{key}")
        if value is None:
            raise GGUFError(f"{file.path} has no {arch}.{key} metadata")
        return value

    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    kv_heads = file.get(f"{arch}.attention.head_count_kv", heads)
    head_dim = int(file.get(f"{arch}.attention.key_length") or hidden // heads)
    embedding = file.tensor("token_embd.weight")
    vocab = int(file.get(f"{arch}.vocab_size") or embedding.shape[-1])  # ggml order: [hidden, vocab]
    cfg: dict[str, Any] = {
        "architectures": [GGUF_ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(kv_heads),
        "head_dim": head_dim,
        "rms_norm_eps": _decimal(file.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(need("context_length")),
        "tie_word_embeddings": not file.has_tensor("output.weight"),
        "attention_bias": arch == "llama" and file.has_tensor("blk.0.attn_output.bias"),
        "torch_dtype": "bfloat16",
    }
    base = file.get(f"{arch}.rope.freq_base")
    if base is not None:
        cfg["rope_theta"] = _decimal(base)
    scaling = _rope_scaling(file, arch, head_dim)
    if scaling is not None:
        cfg["rope_scaling"] = scaling
    return cfg


def _decimal(value: float) -> float:
    """A float32 metadata value as the decimal it was written from (1e-05, not 9.999999747e-06)."""
    return float(str(np.float32(value)))


def _rope_scaling(file: GGUFFile, arch: str, head_dim: int) -> dict[str, Any] | None:
    kind = file.get(f"{arch}.rope.scaling.type")
    if file.has_tensor("rope_freqs.weight"):
        if kind not in (None, "none", "linear"):
            raise GGUFError(f"{file.path}: rope_freqs.weight together with rope scaling {kind!r} is not supported")
        tensor = file.tensor("rope_freqs.weight")
        if tensor.tensor_type != GGMLQuantizationType.F32 or int(tensor.n_elements) != head_dim // 2:
            raise GGUFError(f"{file.path}: rope_freqs.weight must be {head_dim // 2} F32 values, got "
                            f"{int(tensor.n_elements)} {tensor.tensor_type.name}")
        factors = np.asarray(tensor.data, dtype=np.float32).reshape(-1)
        if kind == "linear":  # both apply: llama.cpp divides by the factors and scales positions
            factors = factors * float(file.get(f"{arch}.rope.scaling.factor", 1.0))
        return {"rope_type": "factors", "factors": [float(f) for f in factors]}
    if kind in (None, "none"):
        return None
    scaling: dict[str, Any] = {"rope_type": kind, "factor": float(file.get(f"{arch}.rope.scaling.factor", 1.0))}
    original = file.get(f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    return scaling  # ModelConfig refuses kinds it does not support (e.g. yarn) by name
