"""Convert a Hugging Face Qwen3 checkpoint directory into a GGUF file that llama.cpp runs.

    .venv/bin/python scripts/hf_to_gguf.py MODEL_DIR OUT.gguf --outtype bf16     # or f32, q8_0, q4_0

MODEL_DIR holds config.json, model.safetensors (or shards listed in model.safetensors.index.json),
tokenizer.json, tokenizer_config.json and optionally generation_config.json. The layout follows
llama.cpp's own converter for architecture "qwen3": its tensor names, rotary embeddings in NEOX
order (q and k are not permuted), no output.weight for a tied head, 1-D norm weights in F32
whatever the output type, and the tokenizer as byte-level BPE ("gpt2") with the "qwen2"
pre-tokenizer. Q8_0 and Q4_0 quantise every 2-D weight, the embedding included (llama-quantize
would keep the embedding of a tied Q4_0 model in Q6_K), with gguf's reference quantisers.
Tensors are streamed: one is held in memory at a time.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors import safe_open

OUTTYPES: dict[str, tuple[gguf.GGMLQuantizationType, gguf.LlamaFileType]] = {
    "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
}
ARCH = gguf.MODEL_ARCH.QWEN3


def shard_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in dict.fromkeys(weight_map.values())]
    files = sorted(model_dir.glob("model*.safetensors"))
    if not files:
        raise SystemExit(f"{model_dir}: no model.safetensors or model.safetensors.index.json")
    return files


def hf_shapes(files: list[Path]) -> Iterator[tuple[str, list[int]]]:
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, list(f.get_slice(name).get_shape())


def hf_tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def gguf_name(hf_name: str, names: gguf.TensorNameMap, tied: bool) -> str | None:
    """The llama.cpp name of ``hf_name``, or None for a tensor llama.cpp does not take."""
    if hf_name == "lm_head.weight" and tied:
        return None  # llama.cpp reuses token_embd.weight for a tied head
    if hf_name.endswith("rotary_emb.inv_freq"):
        return None
    name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    if name is None:
        raise SystemExit(f"tensor {hf_name!r} has no qwen3 GGUF name")
    return name


def target_type(shape: list[int], outtype: gguf.GGMLQuantizationType) -> gguf.GGMLQuantizationType:
    if len(shape) <= 1:
        return gguf.GGMLQuantizationType.F32  # norms: llama.cpp keeps 1-D tensors in F32
    block, _ = gguf.GGML_QUANT_SIZES[outtype]
    return outtype if shape[-1] % block == 0 else gguf.GGMLQuantizationType.BF16


def encode(tensor: torch.Tensor, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """``tensor`` (HF order: [out, in]) as the bytes of a ``qtype`` tensor, shaped [rows, row bytes]."""
    if qtype == gguf.GGMLQuantizationType.BF16 and tensor.dtype == torch.bfloat16:
        data = tensor.contiguous().view(torch.int16).numpy().view(np.uint8)  # exact: no round trip
    else:
        data = gguf.quants.quantize(tensor.to(torch.float32).numpy(), qtype).view(np.uint8)
    return data.reshape(*tensor.shape[:-1], -1)


def add_hparams(writer: gguf.GGUFWriter, cfg: dict[str, Any], name: str, ftype: gguf.LlamaFileType) -> None:
    if cfg.get("rope_scaling"):
        raise SystemExit(f"rope_scaling {cfg['rope_scaling']!r} is not supported by this converter")
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    writer.add_name(name)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(cfg.get("num_key_value_heads", heads))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(cfg.get("rope_theta", 1_000_000.0)))
    writer.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    writer.add_file_type(ftype)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def looks_special(text: str) -> bool:
    """llama.cpp's converter marks added tokens spelled like <|...|> as control tokens."""
    return text.startswith("<|") and text.endswith("|>")


def add_vocab(writer: gguf.GGUFWriter, model_dir: Path, n_vocab: int) -> None:
    """Byte-level BPE in llama.cpp's form, padded with unused [PADn] tokens to the embedding's rows."""
    tok = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    if tok["model"]["type"] != "BPE" or tok.get("decoder", {}).get("type") != "ByteLevel":
        raise SystemExit("tokenizer.json is not a byte-level BPE tokenizer")
    by_id: dict[int, tuple[str, gguf.TokenType]] = {
        i: (text, gguf.TokenType.NORMAL) for text, i in tok["model"]["vocab"].items()}
    for added in tok.get("added_tokens", []):
        special = added.get("special", False) or looks_special(added["content"])
        by_id[added["id"]] = (added["content"], gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
    n_vocab = max(n_vocab, max(by_id) + 1)
    tokens = [by_id.get(i, (f"[PAD{i}]", gguf.TokenType.UNUSED)) for i in range(n_vocab)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([text for text, _ in tokens])
    writer.add_token_types([int(kind) for _, kind in tokens])
    special = gguf.SpecialVocab(model_dir, load_merges=True, n_vocab=n_vocab)  # merges, bos/eos/pad, template
    special.add_to_gguf(writer, quiet=True)
    if "bos" not in special.add_special_token:
        writer.add_add_bos_token(False)  # Qwen adds no BOS


def convert(model_dir: Path, out: Path, outtype: str) -> None:
    cfg: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
    if cfg.get("model_type") != "qwen3":
        raise SystemExit(f"{model_dir}: model_type {cfg.get('model_type')!r}, this converter handles qwen3")
    qtype, ftype = OUTTYPES[outtype]
    tied = bool(cfg.get("tie_word_embeddings", False))
    names = gguf.get_tensor_name_map(ARCH, cfg["num_hidden_layers"])
    files = shard_files(model_dir)

    # pass 1: names, shapes and types only, so that the header can be written before the data
    plan: list[tuple[str, str, gguf.GGMLQuantizationType]] = []
    writer = gguf.GGUFWriter(out, gguf.MODEL_ARCH_NAMES[ARCH])
    n_vocab = cfg["vocab_size"]
    for hf_name, hf_shape in hf_shapes(files):
        name = gguf_name(hf_name, names, tied)
        if name is None:
            continue
        kind = target_type(hf_shape, qtype)
        shape = gguf.quants.quant_shape_to_byte_shape(hf_shape, kind)  # [rows, row bytes]
        writer.add_tensor_info(name, shape, np.dtype(np.uint8), int(np.prod(shape)), raw_dtype=kind)
        plan.append((hf_name, name, kind))
        if name == "token_embd.weight":
            n_vocab = hf_shape[0]
    if not tied and not any(name == "output.weight" for _, name, _ in plan):
        raise SystemExit("untied checkpoint without lm_head.weight")
    add_hparams(writer, cfg, model_dir.name, ftype)
    add_vocab(writer, model_dir, n_vocab)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()

    # pass 2: the data, in the same order
    kinds = {hf_name: kind for hf_name, _, kind in plan}
    for hf_name, tensor in hf_tensors(files):
        if hf_name in kinds:
            writer.write_tensor_data(encode(tensor, kinds[hf_name]))
    writer.close()
    print(f"wrote {out}: {len(plan)} tensors, {outtype}, {out.stat().st_size / 2**30:.2f} GiB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path, help="Hugging Face Qwen3 checkpoint directory")
    parser.add_argument("out", type=Path, help="GGUF file to write")
    parser.add_argument("--outtype", choices=sorted(OUTTYPES), default="bf16", help="weight type (default: bf16)")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    convert(args.model_dir, args.out, args.outtype)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
