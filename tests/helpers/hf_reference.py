"""Hugging Face transformers (its Qwen3, Qwen2 and Llama) as the numerical reference (a test dependency only)."""

from __future__ import annotations

from pathlib import Path

import torch


def hf_model(model_dir: Path, dtype: torch.dtype):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


@torch.inference_mode()
def hf_greedy(model, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy decoding with HF's own KV cache; returns tokens and each step's log-softmax."""
    out = model(torch.tensor([prompt]), use_cache=True)
    tokens, logprobs = [], []
    for _ in range(steps):
        logits = out.logits[0, -1].float()
        logprobs.append(torch.log_softmax(logits, dim=-1))
        tokens.append(int(torch.argmax(logits)))
        out = model(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens, logprobs
