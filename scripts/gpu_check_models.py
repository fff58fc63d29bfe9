"""The GPU check's models: random checkpoints (a tiny Qwen3 and the Qwen3-0.6B shape) and
transformers as the reference (``scripts/gpu_check.py``)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

# 3 layers, GQA 2, an untied head: its greedy tokens depend on attention (a tied head this small
# mostly repeats the last token, whatever attention computes)
TINY = {"hidden_size": 96, "intermediate_size": 192, "num_hidden_layers": 3, "num_attention_heads": 6,
        "num_key_value_heads": 3, "head_dim": 32, "max_position_embeddings": 4096, "rope_theta": 10000.0,
        "tie_word_embeddings": False}
TINY_BLOCKS = 1024  # the tiny model's KV pool: 16k tokens
# the weights' spread. Random weights leave small margins between the two most likely tokens: on this
# model transformers' own bf16 picks another top-1 than its float32 at a few % of the positions
# (1.5-4 % in the dry run), which bounds any bf16 agreement measured on it
TINY_STD = 0.05


def tiny_checkpoint(work: Path) -> Path:
    import torch
    from make_random_model import write_tokenizer_files

    from swiftlm.model.random_checkpoint import write_random_checkpoint

    path = work / "tiny"
    if not (path / "model.safetensors").exists():
        write_random_checkpoint(path, TINY, seed=1, dtype=torch.float32, std=TINY_STD)
        write_tokenizer_files(path)
    return path


def qwen3_checkpoint(work: Path, layers: int | None = None) -> Path:
    """Random weights of the Qwen3-0.6B shape (``layers`` layers instead of 28 when given)."""
    import torch
    from make_random_model import write_tokenizer_files

    from swiftlm.model.random_checkpoint import write_random_checkpoint

    path = work / "qwen3"
    if not (path / "model.safetensors").exists():
        shape = {"num_hidden_layers": layers} if layers else {}
        write_random_checkpoint(path, shape, seed=2, dtype=torch.bfloat16)
        write_tokenizer_files(path)
    return path


def hf_model(path: Path, dtype: Any, device: str) -> Any:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval()


def hf_greedy(model: Any, prompt: list[int], steps: int, device: str) -> list[int]:
    import torch

    with torch.inference_mode():
        out = model(torch.tensor([prompt], device=device), use_cache=True)
        tokens: list[int] = []
        for _ in range(steps):
            tokens.append(int(out.logits[0, -1].argmax()))
            out = model(torch.tensor([[tokens[-1]]], device=device), past_key_values=out.past_key_values, use_cache=True)
    return tokens


def hf_argmax(model: Any, ids: list[int], device: str) -> list[int]:
    """Transformers' most likely next token after each position of ``ids`` (one forward)."""
    import torch

    with torch.inference_mode():
        return model(torch.tensor([ids], device=device)).logits[0].argmax(dim=-1).tolist()


def prompts_for(seed: int, n: int, lo: int, hi: int, vocab: int = 150000) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
