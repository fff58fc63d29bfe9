"""Triton kernel: decode attention, one query per sequence over its paged context.

Program ``(b, g)`` handles sequence ``b`` and KV head ``g``: the ``group = Hq / Hkv`` query heads
``g * group .. g * group + group - 1`` that share that KV head form the rows of one tile (padded
to 16 for ``tl.dot``), so each K/V row is read once for all of them. Keys are visited in tiles of
``BLOCK_N`` tokens; token ``t`` lives at slot ``block_tables[b, t // block_size] * block_size +
t % block_size``; tokens ``>= seq_lens[b]`` are masked, so any block size, head count and head_dim
(padded to a power of 2 and masked) works. Online softmax in float32. Reference: the padded SDPA
of ``backends/attention.py``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from swiftlm.backends.cuda.kernels.tile_ops import (
    interpreting,
    launch_inputs,
    round_to,
    softmax_step,
    tile_dot,
)

BLOCK_N = 64  # keys per tile


@triton.jit
def _decode_kernel(
    q_ptr, k_pool_ptr, v_pool_ptr, table_ptr, seq_len_ptr, out_ptr, scale,
    q_stride_t, q_stride_h, o_stride_t, o_stride_h, table_stride,
    GROUP: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRETED: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    seq_len = tl.load(seq_len_ptr + b)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    heads = kvh * GROUP + g  # [BLOCK_G] query heads of this KV head
    qd_mask = (g < GROUP)[:, None] & (d < D)[None, :]
    q = tl.load(q_ptr + b * q_stride_t + heads[:, None] * q_stride_h + d[None, :], mask=qd_mask, other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        keys = start + n  # [BLOCK_N] token positions of this tile
        k_mask = keys < seq_len
        block = tl.load(table_ptr + b * table_stride + keys // PAGE, mask=k_mask, other=0).to(tl.int64)
        rows = block * PAGE + keys % PAGE  # [BLOCK_N] slots
        offs = rows[:, None] * (HKV * D) + kvh * D + d[None, :]  # [BLOCK_N, BLOCK_D]
        kv_mask = k_mask[:, None] & (d < D)[None, :]
        k = tl.load(k_pool_ptr + offs, mask=kv_mask, other=0.0)
        s = tile_dot(q, tl.trans(k), INTERPRETED) * scale  # [BLOCK_G, BLOCK_N]
        s = tl.where(k_mask[None, :], s, float("-inf"))
        v = tl.load(v_pool_ptr + offs, mask=kv_mask, other=0.0)
        m_i, l_i, acc = softmax_step(s, v, m_i, l_i, acc, INTERPRETED)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a row of no keys (seq_len 0, padding) gives 0
    tl.store(out_ptr + b * o_stride_t + heads[:, None] * o_stride_h + d[None, :],
             round_to(out, out_ptr.dtype.element_ty, INTERPRETED), mask=qd_mask)


def decode_attention(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
    scale: float, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [B, Hq, D] (last dim contiguous); pools: [num_blocks, block_size, Hkv, D] contiguous;
    block_tables: [B, max_blocks] int; seq_lens: [B] int (keys 0 .. seq_len - 1). Returns [B, Hq, D]."""
    b, n_q, d = q.shape
    q, out, page, n_kv = launch_inputs(q, k_pool, out)
    if b == 0:
        return out
    group = n_q // n_kv
    _decode_kernel[(b, n_kv)](
        q, k_pool, v_pool, block_tables, seq_lens, out, scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        GROUP=group, HKV=n_kv, D=d, PAGE=page,
        BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_N=BLOCK_N,
        INTERPRETED=interpreting(),
    )
    return out
