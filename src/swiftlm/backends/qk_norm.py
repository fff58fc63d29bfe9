"""The q/k norm weights as the fused ops take them (``fused_forward``, and the CPU decode layers op)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from swiftlm.model.decoder import DecoderAttention


def qk_norm_weights(attn: DecoderAttention, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(q norm weight, k norm weight, eps): empty weights of ``dtype`` when the model has no q/k
    norm (Llama, Qwen2; the ops then rotate the heads as they are)."""
    if attn.q_norm is None:
        empty = torch.empty(0, dtype=dtype)
        return empty, empty, 0.0
    return attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps
