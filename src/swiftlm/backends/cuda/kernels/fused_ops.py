"""Triton kernels: a layer's elementwise steps as single kernels (the ``FusedOps`` of
``backends/fused_forward.py``), so that a decode step launches ~10 kernels a layer instead of ~45.

Each kernel repeats the rounding steps of the plain torch code of ``swiftlm.model.layers``, value by
value: float32 math, and a rounding to the activation dtype (``round_to``) wherever torch would
produce a tensor of that dtype. Launched with ``enable_fp_fusion=False``: no multiply-add is fused
where torch rounds between the two (float32 models then differ from torch only in the order of the
norm's sum and in the last bits of ``rsqrt`` / ``exp``).

* ``rms_norm`` / ``add_rms_norm_``: one program per row (``D`` values, padded to a power of 2);
* ``qk_norm_rope``: one program per token over its fused q/k/v row, its q and k heads as the rows of
  one tile; each head is loaded as its two halves, so the half-split rotation pairs value ``i`` with
  ``i + Dh / 2`` without a gather:

      head:  x1 = x[0 : Dh/2]            | x2 = x[Dh/2 : Dh]
      out:   x1 * cos1 - x2 * sin1       | x2 * cos2 + x1 * sin2     (each product rounded)

* ``silu_mul``: programs over (row, tile of ``I``).

``greedy_pick`` is two torch reductions (``argmax`` returns the first of tied maxima)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from swiftlm.backends.cuda.kernels.tile_ops import interpreting, round_to
from swiftlm.backends.fused_forward import FusedOps

SILU_BLOCK = 1024  # intermediate values per silu_mul program


@triton.jit
def _norm_row(x, w_ptr, cols, mask, D, eps, DTYPE: tl.constexpr, INTERPRETED: tl.constexpr):
    """x [BLOCK] float32 (zeros past D) -> w * dtype(x * rsqrt(mean(x^2) + eps)), float32 values of dtype."""
    inv = tl.rsqrt(tl.sum(x * x, 0) / D + eps)
    h = round_to(x * inv, DTYPE, INTERPRETED).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return w * h


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, delta_ptr, w_ptr, out_ptr, x_stride, res_stride, delta_stride, out_stride, D, eps,
    ADD: tl.constexpr, BLOCK: tl.constexpr, INTERPRETED: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    dtype = out_ptr.dtype.element_ty
    if ADD:  # residual = dtype(residual + delta), written back in place
        r = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0).to(tl.float32)
        a = tl.load(delta_ptr + row * delta_stride + cols, mask=mask, other=0.0).to(tl.float32)
        s = round_to(r + a, dtype, INTERPRETED)
        tl.store(res_ptr + row * res_stride + cols, s, mask=mask)
        x = s.to(tl.float32)
    else:
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    y = _norm_row(x, w_ptr, cols, mask, D, eps, dtype, INTERPRETED)
    tl.store(out_ptr + row * out_stride + cols, round_to(y, dtype, INTERPRETED), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(
    qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, k_ptr, qkv_stride, eps,
    HQ: tl.constexpr, HK: tl.constexpr, DH: tl.constexpr, HEADS_BLOCK: tl.constexpr, HALF_BLOCK: tl.constexpr,
    NORM: tl.constexpr, INTERPRETED: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)  # one token per program: its q heads, then its k heads
    half: tl.constexpr = DH // 2
    h = tl.arange(0, HEADS_BLOCK)  # [H] heads 0 .. HQ - 1 are q's, HQ .. HQ + HK - 1 k's
    i = tl.arange(0, HALF_BLOCK)  # [I] positions within a half head
    mask = (h < HQ + HK)[:, None] & (i < half)[None, :]  # [H, I]
    dtype = q_ptr.dtype.element_ty
    src = qkv_ptr + t * qkv_stride + h[:, None] * DH + i[None, :]  # q heads, then k heads, back to back
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)  # [H, I] first halves
    x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)  # [H, I] second halves
    if NORM:
        is_q = (h < HQ)[:, None]
        inv = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / DH + eps)[:, None]  # [H, 1]
        w_mask = i < half
        w1 = tl.where(is_q, tl.load(qw_ptr + i, mask=w_mask, other=0.0)[None, :],
                      tl.load(kw_ptr + i, mask=w_mask, other=0.0)[None, :]).to(tl.float32)
        w2 = tl.where(is_q, tl.load(qw_ptr + half + i, mask=w_mask, other=0.0)[None, :],
                      tl.load(kw_ptr + half + i, mask=w_mask, other=0.0)[None, :]).to(tl.float32)
        x1 = round_to(w1 * round_to(x1 * inv, dtype, INTERPRETED).to(tl.float32), dtype, INTERPRETED).to(tl.float32)
        x2 = round_to(w2 * round_to(x2 * inv, dtype, INTERPRETED).to(tl.float32), dtype, INTERPRETED).to(tl.float32)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    i_mask = i < half
    c1 = round_to(tl.load(cos_ptr + pos * DH + i, mask=i_mask, other=0.0), dtype, INTERPRETED).to(tl.float32)[None, :]
    c2 = round_to(tl.load(cos_ptr + pos * DH + half + i, mask=i_mask, other=0.0), dtype, INTERPRETED).to(tl.float32)[None, :]
    s1 = round_to(tl.load(sin_ptr + pos * DH + i, mask=i_mask, other=0.0), dtype, INTERPRETED).to(tl.float32)[None, :]
    s2 = round_to(tl.load(sin_ptr + pos * DH + half + i, mask=i_mask, other=0.0), dtype, INTERPRETED).to(tl.float32)[None, :]
    # torch: x * cos + cat(-x2, x1) * sin, each product a tensor of dtype, then their sum
    a1 = round_to(x1 * c1, dtype, INTERPRETED).to(tl.float32)
    b1 = round_to(-x2 * s1, dtype, INTERPRETED).to(tl.float32)
    a2 = round_to(x2 * c2, dtype, INTERPRETED).to(tl.float32)
    b2 = round_to(x1 * s2, dtype, INTERPRETED).to(tl.float32)
    o1 = round_to(a1 + b1, dtype, INTERPRETED)
    o2 = round_to(a2 + b2, dtype, INTERPRETED)
    q_dst = q_ptr + (t * HQ + h[:, None]) * DH + i[None, :]  # rows h < HQ
    k_dst = k_ptr + (t * HK + (h[:, None] - HQ)) * DH + i[None, :]  # rows HQ <= h < HQ + HK
    q_mask = mask & (h < HQ)[:, None]
    k_mask = mask & (h >= HQ)[:, None]
    tl.store(q_dst, o1, mask=q_mask)
    tl.store(q_dst + half, o2, mask=q_mask)
    tl.store(k_dst, o1, mask=k_mask)
    tl.store(k_dst + half, o2, mask=k_mask)


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, gu_stride, out_stride, inter, BLOCK: tl.constexpr, INTERPRETED: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    dtype = out_ptr.dtype.element_ty
    g = tl.load(gu_ptr + row * gu_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * gu_stride + inter + cols, mask=mask, other=0.0).to(tl.float32)
    s = round_to(g / (1.0 + tl.exp(-g)), dtype, INTERPRETED).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, round_to(s * u, dtype, INTERPRETED), mask=mask)


def _launch_options() -> dict:
    # no multiply-add fusion on the GPU (the interpreter takes no compiler options)
    return {} if interpreting() else {"enable_fp_fusion": False}


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _norm(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm(x) [T, D]; with ``delta``, x += delta first (in place, rounded to x's dtype)."""
    t, d = x.shape
    out = torch.empty_like(x)
    if t:
        add = delta is not None
        # ADD reads (and writes back) the residual at res_ptr, else x at x_ptr
        _rms_norm_kernel[(t,)](x, x, delta if add else x, w, out, x.stride(0), x.stride(0),
                               delta.stride(0) if add else 0, out.stride(0), d, eps, ADD=add,
                               BLOCK=triton.next_power_of_2(d), INTERPRETED=interpreting(), **_launch_options())
    return out


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, D] -> [T, D] (a new tensor)."""
    return _norm(_rows(x), None, w, eps)


def add_rms_norm_(residual: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """residual [T, D] += delta (rounded to its dtype, in place) -> rms_norm(residual) [T, D]."""
    if residual.stride(-1) != 1:
        raise ValueError("add_rms_norm_: the residual must have unit stride in its last dimension")
    return _norm(residual, _rows(delta), w, eps)


def qk_norm_rope(
    qkv: torch.Tensor, q_w: torch.Tensor, k_w: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    positions: torch.Tensor, hq: int, hk: int, eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv [T, (Hq + 2 Hk) * Dh] -> q [T, Hq, Dh], k [T, Hk, Dh]; cos, sin float32 [P, Dh]; empty
    q_w and k_w: no norm (Llama, Qwen2). Positions must lie in [0, P) (the engine bounds them by
    max_model_len; no check here, which would cost a device sync)."""
    qkv = _rows(qkv)
    t, dh = qkv.shape[0], cos.shape[1]
    if qkv.shape[1] != (hq + 2 * hk) * dh or dh % 2:
        raise ValueError(f"qk_norm_rope: qkv width {qkv.shape[1]} is not ({hq} + 2 * {hk}) * {dh} with {dh} even")
    norm = q_w.numel() > 0
    q = torch.empty((t, hq, dh), dtype=qkv.dtype, device=qkv.device)
    k = torch.empty((t, hk, dh), dtype=qkv.dtype, device=qkv.device)
    if t:
        _qk_norm_rope_kernel[(t,)](
            qkv, q_w if norm else qkv, k_w if norm else qkv, cos, sin, positions, q, k, qkv.stride(0), eps,
            HQ=hq, HK=hk, DH=dh, HEADS_BLOCK=triton.next_power_of_2(hq + hk),
            HALF_BLOCK=triton.next_power_of_2(dh // 2), NORM=norm,
            INTERPRETED=interpreting(), **_launch_options(),
        )
    return q, k


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2 I] -> [..., I]."""
    gu = gate_up.reshape(-1, gate_up.shape[-1])
    gu = _rows(gu)
    rows, inter = gu.shape[0], gu.shape[1] // 2
    out = torch.empty((rows, inter), dtype=gu.dtype, device=gu.device)
    if rows:
        block = min(SILU_BLOCK, triton.next_power_of_2(inter))
        _silu_mul_kernel[(rows, triton.cdiv(inter, block))](gu, out, gu.stride(0), out.stride(0), inter, BLOCK=block,
                                                           INTERPRETED=interpreting(), **_launch_options())
    return out.reshape(*gate_up.shape[:-1], inter)


def greedy_pick(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, V] float32 -> (argmax [B] int64, the first of tied maxima; all finite [B] bool)."""
    return logits.argmax(dim=-1), torch.isfinite(logits).all(dim=-1)


def triton_fused_ops() -> FusedOps:
    return FusedOps(rms_norm=rms_norm, add_rms_norm_=add_rms_norm_, qk_norm_rope=qk_norm_rope, silu_mul=silu_mul,
                    greedy_pick=greedy_pick)
