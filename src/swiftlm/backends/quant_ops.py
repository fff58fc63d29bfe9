"""Int8 / int4 weight-only quantisation: the ops a quantised linear layer needs (``QuantOps``) and
their plain torch definitions (``TORCH_OPS``), which define the math, serve as the test oracle and
as the fallback of every backend. Compiled twins come from a backend (the CPU one:
``backends/cpu/kernels/quant_cpu.py``). The two GEMVs here compute in float64, which holds the
kernels' integer dot products exactly.

Shapes (N output channels, K input features, N16 = ceil(N / 16), G the int4 group size)::

    quantize_activations(x [M, K]) -> (q int8 [M, K], scale float32 [M, K/32], sum int32 [M, K/32])
    fake_quantize_activations(x [M, K]) -> scale * q, rounded once to x's dtype
    int8_gemv(x [M, K], qweight uint8 [N16, K/4, 64], scales float32 [N], n) -> [M, N]
    int4_gemv(x [M, K], qweight uint8 [N16, K/32, 4, 64], scales, mins float16 [N16, K/G, 16], n)
    int8_dequantize(qweight, scales, n0, n1, dtype) -> weights of channels n0..n1-1 [n1 - n0, K]
    int4_dequantize(qweight, scales, mins, n0, n1, dtype) -> [n1 - n0, K]

``n0`` must be a multiple of 16.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

QK = 32  # activation quantisation block along K
TILE = 16  # output channels per packed tile
_TINY = 1e-30  # a block whose max |x| is below this quantises to zeros
_CHUNK_ELEMENTS = 1 << 22  # the float64 oracle dequantises this many weights at a time


@dataclass(frozen=True, slots=True)
class QuantOps:
    quantize_activations: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    fake_quantize_activations: Callable[..., torch.Tensor]
    int8_gemv: Callable[..., torch.Tensor]
    int4_gemv: Callable[..., torch.Tensor]
    int8_dequantize: Callable[..., torch.Tensor]
    int4_dequantize: Callable[..., torch.Tensor]

    def __deepcopy__(self, memo: dict) -> QuantOps:
        return self  # stateless; models holding it can be deep-copied


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, k = x.shape
    xb = x.float().reshape(m, k // QK, QK)
    amax = xb.abs().amax(-1, keepdim=True)
    live = amax >= _TINY
    # 127 / amax and amax / 127 rounded correctly to float32 as in C++ (torch's float32 division by
    # or of a scalar multiplies by a reciprocal; float64 then float32 rounds correctly for division)
    a64 = amax.double()
    inv = torch.where(live, (127.0 / a64).float(), 0.0)
    q = torch.round(xb * inv).clamp_(-127, 127)  # x * (127 / amax), rounded half to even, as the kernel
    scale = torch.where(live, (a64 / 127.0).float(), 0.0)
    return q.to(torch.int8).reshape(m, k), scale.squeeze(-1), q.sum(-1).to(torch.int32)


def fake_quantize_activations(x: torch.Tensor) -> torch.Tensor:
    return dequantize_activations(x, torch.float32).to(x.dtype)


def dequantize_activations(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """scale * q of ``quantize_activations(x)`` as ``dtype`` (exact in float64)."""
    m, k = x.shape
    q, scale, _ = quantize_activations(x)
    return (q.to(dtype).view(m, k // QK, QK) * scale.to(dtype).unsqueeze(-1)).view(m, k)


def int8_dequantize(
    qweight: torch.Tensor, scales: torch.Tensor, n0: int, n1: int, dtype: torch.dtype
) -> torch.Tensor:
    k = qweight.shape[1] * 4
    tiles = qweight[n0 // TILE : -(-n1 // TILE)]
    u = tiles.view(-1, k // 4, TILE, 4).permute(0, 2, 1, 3).reshape(-1, k)[: n1 - n0]  # [n, K]
    work = torch.float64 if dtype == torch.float64 else torch.float32
    return ((u.to(work) - 128) * scales[n0:n1].to(work).unsqueeze(1)).to(dtype)


def int4_dequantize(
    qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, n0: int, n1: int, dtype: torch.dtype
) -> torch.Tensor:
    nb, ng = qweight.shape[1], scales.shape[1]
    t0, t1 = n0 // TILE, -(-n1 // TILE)
    packed = qweight[t0:t1]  # [t, nb, 4, 64]: low nibbles k = 4v + i, high nibbles 16 + 4v + i
    steps = torch.cat((packed & 0x0F, packed >> 4), dim=2)  # [t, nb, 8 steps of 4 k, 16 * 4]
    u = steps.view(-1, nb, 8, TILE, 4).permute(0, 3, 1, 2, 4).reshape(-1, ng, nb * QK // ng)  # [t * 16, ng, G]
    work = torch.float64 if dtype == torch.float64 else torch.float32

    def per_group(t: torch.Tensor) -> torch.Tensor:  # [t, ng, 16] -> [t * 16, ng, 1]
        return t[t0:t1].transpose(1, 2).reshape(-1, ng, 1).to(work)

    w = per_group(scales) * u.to(work) + per_group(mins)
    return w.reshape(-1, nb * QK)[: n1 - n0].to(dtype)


def int8_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, n: int) -> torch.Tensor:
    return _gemv64(x, n, qweight.shape[1] * 4, lambda n0, n1: int8_dequantize(qweight, scales, n0, n1, torch.float64))


def int4_gemv(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, n: int
) -> torch.Tensor:
    k = qweight.shape[1] * QK
    return _gemv64(x, n, k, lambda n0, n1: int4_dequantize(qweight, scales, mins, n0, n1, torch.float64))


def _gemv64(
    x: torch.Tensor, n: int, k: int, weights: Callable[[int, int], torch.Tensor]
) -> torch.Tensor:
    """(scale * q) @ W^T in float64, a slice of output channels at a time; rounded once to x's dtype."""
    xa = dequantize_activations(x, torch.float64)  # exact: float32 scale times a 7-bit integer
    out = torch.empty(x.shape[0], n, dtype=torch.float64, device=x.device)
    step = max(TILE, _CHUNK_ELEMENTS // k // TILE * TILE)
    for n0 in range(0, n, step):
        n1 = min(n, n0 + step)
        out[:, n0:n1] = xa @ weights(n0, n1).T
    return out.to(x.dtype)


TORCH_OPS = QuantOps(
    quantize_activations=quantize_activations,
    fake_quantize_activations=fake_quantize_activations,
    int8_gemv=int8_gemv,
    int4_gemv=int4_gemv,
    int8_dequantize=int8_dequantize,
    int4_dequantize=int4_dequantize,
)
