"""The tile operations whose precision the kernels state: ``tl.dot`` and the rounding casts; and
``softmax_step``, the online softmax over one tile of keys that both attention kernels run.

``tile_dot``: ``input_precision="ieee"``: float32 tiles multiply in full float32 on the GPU (no
TF32), as the interpreter does, so CI tests what the GPU runs; bfloat16 / float16 tiles multiply
in their own precision with float32 accumulation (the argument does not apply to them).

``round_to``: a cast that rounds to nearest even, as the GPU's does.

``INTERPRETED`` is true under Triton's interpreter only (``interpreting()``), which differs from
the GPU in two places (checked with Triton 3.9): its ``tl.dot`` multiplies the raw bits of
bfloat16 tiles (it holds them as uint16), and its float32 -> bfloat16 cast truncates. There,
bfloat16 tiles are converted to float32 before the dot (exact, and a product of two bfloat16
values is exact in float32: the same sum as the GPU's bfloat16 dot with float32 accumulation, up
to the order of the additions), and the cast rounds to nearest even by hand on the bits."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def tile_dot(a, b, INTERPRETED: tl.constexpr):
    if INTERPRETED:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def round_to(x, dtype: tl.constexpr, INTERPRETED: tl.constexpr):
    if INTERPRETED and dtype == tl.bfloat16 and x.dtype == tl.float32:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)  # round the low 16 bits to nearest, ties to even
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


@triton.jit
def softmax_step(s, v, m_i, l_i, acc, INTERPRETED: tl.constexpr):
    """One tile of keys in the online softmax: ``s`` [R, N] scaled scores, -inf where masked;
    ``v`` [N, D] the tile's values; ``m_i`` [R] running max, ``l_i`` [R] running sum, ``acc`` [R, D]
    (float32). Returns them updated. A row that has seen no key yet keeps max -inf, sum 0 and
    accumulator 0 (its max is taken as 0, so no -inf - -inf)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tile_dot(round_to(p, v.dtype, INTERPRETED), v, INTERPRETED)
    return m_new, l_i, acc


def interpreting() -> bool:
    """Whether kernels launched now run under Triton's interpreter (``TRITON_INTERPRET=1``)."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def launch_inputs(q, k_pool, out):
    """What both attention launchers start from: q with a contiguous last dim, the output buffer
    (``out`` or a fresh one like q), and the pools' page size and kv head count."""
    if q.stride(2) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty_like(q)
    return q, out, k_pool.shape[1], k_pool.shape[2]
