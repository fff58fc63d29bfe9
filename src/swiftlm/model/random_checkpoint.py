"""Write random Qwen3 checkpoints (Hugging Face layout) for tests and benchmarks.

Speed does not depend on weight values, and numerical equivalence tests only need the same
weights on both sides, so random checkpoints stand in for real ones wherever weights cannot be
downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from swiftlm.config import ModelConfig
from swiftlm.model.decoder import expected_tensor_shapes

QWEN3_0_6B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}

QWEN3_GENERATION_CONFIG: dict[str, Any] = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
}


def write_random_checkpoint(
    dst: str | Path,
    config: dict[str, Any],
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    std: float = 0.02,
    generation_config: dict[str, Any] | None = None,
) -> Path:
    """Write config.json, generation_config.json and model.safetensors with random weights.

    Norm weights are drawn around 1 and projections from N(0, std), the embedding with a larger
    spread so that random models produce varied, non-degenerate logits.
    """
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    full = {**QWEN3_0_6B, **config}
    shapes = expected_tensor_shapes(ModelConfig.from_dict(full))
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name == "model.embed_tokens.weight":
            t = torch.randn(shape, generator=gen) * (std * 10)
        else:
            t = torch.randn(shape, generator=gen) * std
        tensors[name] = t.to(dtype).contiguous()
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    full["torch_dtype"] = str(dtype).removeprefix("torch.")
    (dst / "config.json").write_text(json.dumps(full, indent=2))
    gen_cfg = QWEN3_GENERATION_CONFIG if generation_config is None else generation_config
    (dst / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2))
    return dst
