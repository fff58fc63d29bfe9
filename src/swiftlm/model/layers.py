"""Building blocks of the decoder: RMSNorm, rotary embedding (with Llama 3's and linear scaling), SwiGLU MLP.

Numerics follow the reference implementation (norm statistics in float32, then cast back to the
activation dtype before the weight multiply; rotary tables computed in float32 and cast to the
activation dtype) so that bfloat16 runs round the same way.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (half-split layout) looked up by absolute position."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None = None) -> None:
        super().__init__()
        # computed on the CPU even inside a meta-device context (the loader builds the model there;
        # meta tensors would go through torch._refs, whose first use imports torch._dynamo: ~1.5 s)
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))
        if scaling is not None:
            inv_freq = scaled_frequencies(inv_freq, scaling)
        t = torch.arange(max_positions, dtype=torch.float32, device="cpu")
        freqs = torch.outer(t, inv_freq)  # [max_positions, head_dim / 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [max_positions, head_dim]
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def table(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for the step's positions, [T, 1, head_dim] each: looked up once per step."""
        cos = self.cos_cached[positions].to(dtype).unsqueeze(1)
        sin = self.sin_cached[positions].to(dtype).unsqueeze(1)
        return cos, sin


def scaled_frequencies(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Rotary frequencies [head_dim / 2] under a config's ``rope_scaling``.

    "linear": every frequency divided by ``factor`` (positions stretched). "llama3": wavelengths
    longer than ``original_max_position_embeddings / low_freq_factor`` are stretched by ``factor``,
    those shorter than ``... / high_freq_factor`` kept, and the band between blends the two linearly
    in ``original / wavelength``. "factors" (a GGUF's ``rope_freqs.weight``, how llama.cpp writes
    Llama 3's scaling): each frequency divided by its own factor."""
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "factors":
        factors = torch.tensor(scaling["factors"], dtype=torch.float32, device=inv_freq.device)
        if factors.shape != inv_freq.shape:
            raise ValueError(f"rope scaling has {factors.numel()} factors for {inv_freq.numel()} frequencies")
        return inv_freq / factors
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor
    low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
    original = float(scaling.get("original_max_position_embeddings", 8192))
    wavelength = 2 * math.pi / inv_freq
    blend = ((original / wavelength - low) / (high - low)).clamp(0.0, 1.0)  # 0: stretched, 1: kept
    scaled = (1 - blend) * inv_freq / factor + blend * inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, scaled)
    return torch.where(wavelength < original / high, inv_freq, scaled)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [T, n_heads, head_dim], k: [T, n_kv_heads, head_dim]; table from RotaryEmbedding.table."""
    cos, sin = table
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.gate_up_proj: nn.Module | None = None  # gate and up in one matmul (see model.fuse)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
