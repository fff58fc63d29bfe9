"""The small KV cache: K and V rows stored in 8 bits with one float32 scale per (token, head).

``--kv-cache-dtype`` (vLLM's flag and names): ``auto`` keeps the model's dtype; ``int8`` stores
``round(x / s)`` with ``s = amax / 127``; ``fp8`` / ``fp8_e4m3`` store ``x / s`` as float8 e4m3 with
``s = amax / 448``; ``fp8_e5m2`` as float8 e5m2 with ``s = amax / 57344`` (amax: the largest
magnitude of the row of ``head_dim`` values; a row of zeros gets ``s = 1``). A token's row of one head
is then ``head_dim`` bytes plus 4 (132 instead of 256 for Qwen3's bf16 rows of 128): about twice the
tokens in the same memory, and half the bytes a decode step's attention reads.

These functions are the reference (and the oracle of the kernels): the CPU decode kernels
(``cpu/kernels/kv_quant.h``) quantise with the same float32 operations in the same order, so the
pools come out bit for bit the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from swiftlm.config import KV_CACHE_DTYPES


@dataclass(frozen=True, slots=True)
class KVFormat:
    """How K/V rows are stored: ``storage`` elements scaled by ``qmax / amax`` per (token, head)."""

    name: str  # int8 | fp8_e4m3 | fp8_e5m2
    storage: torch.dtype
    qmax: float
    code: int  # the kernels' format argument: 1 int8, 2 e4m3, 3 e5m2


_FORMATS = {
    "int8": KVFormat("int8", torch.int8, 127.0, 1),
    "fp8_e4m3": KVFormat("fp8_e4m3", torch.float8_e4m3fn, 448.0, 2),
    "fp8_e5m2": KVFormat("fp8_e5m2", torch.float8_e5m2, 57344.0, 3),
}


def kv_format(kv_cache_dtype: str) -> KVFormat | None:
    """The storage format ``--kv-cache-dtype`` names (None: ``auto``, the model's own dtype)."""
    if kv_cache_dtype == "auto":
        return None
    name = "fp8_e4m3" if kv_cache_dtype == "fp8" else kv_cache_dtype
    if name not in _FORMATS:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    return _FORMATS[name]


def quantize_kv(x: torch.Tensor, fmt: KVFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H, D] (any float dtype) -> (values [T, H, D] in ``fmt.storage``, scales [T, H] float32)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1)  # [T, H]
    scale = torch.where(amax > 0, amax / fmt.qmax, torch.ones_like(amax))
    y = xf / scale.unsqueeze(-1)
    if fmt.storage == torch.int8:
        q = y.round().clamp_(-127.0, 127.0).to(torch.int8)  # round half to even, as the kernels
    else:
        q = y.clamp_(-fmt.qmax, fmt.qmax).to(fmt.storage)
    return q, scale


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """values [..., D] and scales [...] -> [..., D] in ``dtype``."""
    return (q.float() * scale.unsqueeze(-1)).to(dtype)
