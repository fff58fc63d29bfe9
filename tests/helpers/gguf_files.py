"""Write a tiny Hugging Face checkpoint (tests/conftest.py) as a GGUF file, the way llama.cpp's
convert_hf_to_gguf.py does: llama.cpp's tensor names, q/k rows permuted for the llama
architecture, Llama 3 rotary scaling as a ``rope_freqs.weight`` tensor, the tokenizer as
``tokenizer.ggml.*`` metadata, and each tensor in the type asked for."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants
from safetensors.numpy import load_file

_ARCH = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
_BLOCK = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
_CONTROL, _USER_DEFINED, _NORMAL = 3, 4, 1


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_BLOCK[module]}.{kind}"


def permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute (rows of each head: halves -> interleaved pairs)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(cfg: dict) -> np.ndarray:
    """convert_hf_to_gguf's rope_freqs for rope_type llama3: the divisor of each frequency."""
    scaling = cfg["rope_scaling"]
    dim = cfg["head_dim"]
    freqs = 1.0 / (cfg["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_gguf(
    model_dir: Path,
    dst: Path,
    qtype: Q = Q.F32,
    tokenizer: bool = False,
    drop: Iterable[str] = (),
    arch: str | None = None,
    types: dict[str, Q] | None = None,
) -> Path:
    """``model_dir`` (config.json + model.safetensors [+ tokenizer files]) as the GGUF file ``dst``.

    2-D weights get ``qtype`` (F32 where a row is not a whole number of its blocks, as llama.cpp
    falls back), norms and biases F32; ``types`` overrides per GGUF tensor name; ``drop`` leaves
    GGUF tensors out; ``arch`` overrides general.architecture."""
    cfg = json.loads((model_dir / "config.json").read_text())
    name = arch or _ARCH[cfg["architectures"][0]]
    tensors = load_file(str(model_dir / "model.safetensors"))
    w = gguf.GGUFWriter(str(dst), name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_rope_freq_base(float(cfg["rope_theta"]))
    w.add_vocab_size(cfg["vocab_size"])
    if (cfg.get("rope_scaling") or {}).get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg))
    if tokenizer:
        _add_tokenizer(w, model_dir)
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    for hf, value in tensors.items():
        target = gguf_name(hf)
        if target in drop:
            continue
        value = value.astype(np.float32)
        if name == "llama" and ".q_proj." in hf:
            value = permute(value, heads)
        elif name == "llama" and ".k_proj." in hf:
            value = permute(value, kv_heads)
        kind = (types or {}).get(target, qtype if value.ndim == 2 else Q.F32)
        block = gguf.GGML_QUANT_SIZES[kind][0]
        if kind == Q.F32 or value.shape[-1] % block:
            w.add_tensor(target, np.ascontiguousarray(value))
        elif kind == Q.F16:
            w.add_tensor(target, value.astype(np.float16))
        else:
            w.add_tensor(target, quants.quantize(value, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def _add_tokenizer(w: gguf.GGUFWriter, model_dir: Path) -> None:
    """The Qwen tokenizer.json / tokenizer_config.json as llama.cpp writes them (pre "qwen2")."""
    spec = json.loads((model_dir / "tokenizer.json").read_text())
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    vocab = dict(spec["model"]["vocab"])
    kinds = {}
    for added in spec["added_tokens"]:
        vocab[added["content"]] = added["id"]
        kinds[added["id"]] = _CONTROL if added["special"] else _USER_DEFINED
    tokens = [""] * (max(vocab.values()) + 1)
    for token, index in vocab.items():
        tokens[index] = token
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([kinds.get(i, _NORMAL) for i in range(len(tokens))])
    w.add_token_merges(merges)
    w.add_eos_token_id(vocab[config["eos_token"]])
    w.add_pad_token_id(vocab[config["pad_token"]])
    w.add_bos_token_id(vocab["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(config["chat_template"])
