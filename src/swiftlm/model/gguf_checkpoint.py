"""Load a GGUF checkpoint (llama.cpp's format) into the decoder.

Every tensor type is dequantised at load, one tensor at a time, to the served dtype: F32, F16 and
BF16 are converted, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K dequantised with ``gguf.quants.dequantize``
(llama.cpp's own reference code). None is mapped directly onto swiftlm's int8/int4 kernels (their
block layouts differ); ``--quantization int8|int4`` re-quantises from the dequantised weights, as it
does for any checkpoint, when the backend prepares the model after load.

GGUF stores shapes in ggml order (fastest-varying dimension first, ``[in, out]`` for a linear
weight); the reader's data already has the row-major shape ``[out, in]``, which is what the
decoder's Hugging Face layout wants. llama.cpp's converter permutes the rows of q and k (weights
and biases) for the llama architecture only (its rotary kernel pairs adjacent elements, the
Hugging Face layout pairs the two halves of a head); that permutation is undone here.
"""

from __future__ import annotations

import re

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from swiftlm.config import ModelConfig
from swiftlm.core.gguf_file import GGUFError, GGUFFile
from swiftlm.model.assemble import assemble_model
from swiftlm.model.decoder import DecoderForCausalLM, expected_tensor_shapes
from swiftlm.model.gguf_config import gguf_config_dict

_Q = GGMLQuantizationType
SUPPORTED_TYPES = (_Q.F32, _Q.F16, _Q.BF16, _Q.Q8_0, _Q.Q4_0, _Q.Q4_1, _Q.Q4_K, _Q.Q5_K, _Q.Q6_K)
_TOP_LEVEL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
_BLOCK = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_IGNORED = {"rope_freqs.weight"}  # read into the config (rope scaling), not a parameter


def hf_tensor_name(name: str) -> str | None:
    """The Hugging Face name of GGUF tensor ``name`` (None for a name the decoder has no use for)."""
    if name in _TOP_LEVEL:
        return _TOP_LEVEL[name]
    match = _BLOCK_NAME.fullmatch(name)
    if match is None or match.group(2) not in _BLOCK:
        return None
    return f"model.layers.{match.group(1)}.{_BLOCK[match.group(2)]}.{match.group(3)}"


def gguf_model_config(file: GGUFFile) -> ModelConfig:
    return ModelConfig.from_dict(gguf_config_dict(file))


def load_gguf_model(
    file: GGUFFile, dtype: torch.dtype, device: str | torch.device = "cpu", config: ModelConfig | None = None
) -> DecoderForCausalLM:
    """The decoder with ``file``'s weights, dequantised to ``dtype`` on ``device``."""
    config = config or gguf_model_config(file)
    expected = expected_tensor_shapes(config)
    renamed = {hf_tensor_name(n): n for n in file.tensor_names() if n not in _IGNORED}
    unexpected = [gguf for hf, gguf in renamed.items() if hf is None or hf not in expected]
    if config.tie_word_embeddings:
        unexpected = [n for n in unexpected if n != "output.weight"]
    missing = [hf for hf in expected if hf not in renamed]
    if missing or unexpected:
        parts = [f"missing tensors (Hugging Face names): {', '.join(missing[:8])}"] if missing else []
        if unexpected:
            parts.append(f"tensors swiftlm has no use for: {', '.join(unexpected[:8])}")
        raise GGUFError(f"{file.path} does not match its {file.architecture} metadata: " + "; ".join(parts))
    state: dict[str, torch.Tensor] = {}
    for hf_name in expected:
        tensor = _read_tensor(file, renamed[hf_name], expected[hf_name])
        if config.architecture == "LlamaForCausalLM" and ".q_proj." in hf_name:
            tensor = _unpermute(tensor, config.num_attention_heads)
        elif config.architecture == "LlamaForCausalLM" and ".k_proj." in hf_name:
            tensor = _unpermute(tensor, config.num_key_value_heads)
        state[hf_name] = tensor.to(device=device, dtype=dtype)
    return assemble_model(config, state, device)


def _read_tensor(file: GGUFFile, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """One tensor as a fresh float tensor of ``shape`` (row-major, Hugging Face layout)."""
    entry = file.tensor(name)
    qtype = entry.tensor_type
    if qtype not in SUPPORTED_TYPES:
        raise GGUFError(f"{file.path}: tensor {name} has type {qtype.name}, which swiftlm cannot load; "
                        f"supported: {', '.join(t.name for t in SUPPORTED_TYPES)}")
    ggml_shape = tuple(int(d) for d in entry.shape)
    if tuple(reversed(ggml_shape)) != shape:
        raise GGUFError(f"{file.path}: tensor {name} has shape {tuple(reversed(ggml_shape))} (ggml order "
                        f"{ggml_shape}) but the metadata expects {shape}")
    data = entry.data
    if qtype == _Q.F32:
        return torch.from_numpy(np.array(data, dtype=np.float32).reshape(shape))  # the copy detaches the map
    if qtype == _Q.F16:
        return torch.from_numpy(np.array(data, dtype=np.float16).reshape(shape))
    if qtype == _Q.BF16:  # raw 16-bit words; torch reads them as bfloat16 without a float32 detour
        raw = np.array(data).view(np.int16).reshape(shape)
        return torch.from_numpy(raw).view(torch.bfloat16)
    try:
        values = quants.dequantize(data, qtype)
    except (ValueError, quants.QuantError) as exc:
        raise GGUFError(f"{file.path}: tensor {name} ({qtype.name}) could not be dequantised: {exc}") from exc
    return torch.from_numpy(values.reshape(shape))


def _unpermute(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo convert_hf_to_gguf's llama q/k permutation of rows (each head's rows reordered from the
    two-halves layout to interleaved pairs): [n_heads, 2, d/2, ...] <- [n_heads, d/2, 2, ...]."""
    rows = weight.shape[0]
    return weight.reshape(n_heads, rows // n_heads // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)
