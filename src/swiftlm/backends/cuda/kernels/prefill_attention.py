"""Triton kernel: varlen causal prefill attention over the paged context.

The step's query rows are flat, request after request (``query_start``); request ``r``'s
``q_len`` rows are the last of its ``seq_len`` tokens, so its query row ``i`` sits at absolute
position ``p = seq_len - q_len + i`` and attends keys ``0 .. p`` of its sequence, all read through
its block table (prefix-cached blocks and the chunk's own new K/V, stored before the call):

    keys:     0 ............ seq_len - q_len - 1 | seq_len - q_len ...... seq_len - 1
              cached context (earlier chunks)    | this chunk's rows (causal among themselves)

Program ``(r, m, h)`` computes rows ``m * BLOCK_M ..`` of request ``r`` for query head ``h``
(KV head ``h // group``); programs past a request's rows do nothing. Key tiles stop at the tile's
last row position. Online softmax in float32. Reference: gather + SDPA of ``backends/attention.py``."""

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

BLOCK_M = 64  # query rows per tile
BLOCK_N = 64  # keys per tile


@triton.jit
def _prefill_kernel(
    q_ptr, k_pool_ptr, v_pool_ptr, table_ptr, query_start_ptr, seq_len_ptr, out_ptr, scale,
    q_stride_t, q_stride_h, o_stride_t, o_stride_h, table_stride,
    GROUP: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRETED: tl.constexpr,
):
    r = tl.program_id(0)
    tile = tl.program_id(1)
    h = tl.program_id(2)
    q_lo = tl.load(query_start_ptr + r)
    q_len = tl.load(query_start_ptr + r + 1) - q_lo
    if tile * BLOCK_M < q_len:
        seq_len = tl.load(seq_len_ptr + r)
        kvh = h // GROUP
        i = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] query rows within the request
        row_mask = i < q_len
        pos = seq_len - q_len + i  # [BLOCK_M] absolute positions
        d = tl.arange(0, BLOCK_D)
        n = tl.arange(0, BLOCK_N)
        d_mask = d < D
        q_rows = (q_lo + i).to(tl.int64)
        qd_mask = row_mask[:, None] & d_mask[None, :]
        q = tl.load(q_ptr + q_rows[:, None] * q_stride_t + h * q_stride_h + d[None, :], mask=qd_mask, other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        key_end = tl.minimum(seq_len, seq_len - q_len + (tile + 1) * BLOCK_M)  # past the tile's last row
        for start in range(0, key_end, BLOCK_N):
            keys = start + n  # [BLOCK_N]
            k_mask = keys < seq_len
            block = tl.load(table_ptr + r * table_stride + keys // PAGE, mask=k_mask, other=0).to(tl.int64)
            rows = block * PAGE + keys % PAGE  # [BLOCK_N] slots
            offs = rows[:, None] * (HKV * D) + kvh * D + d[None, :]  # [BLOCK_N, BLOCK_D]
            kv_mask = k_mask[:, None] & d_mask[None, :]
            k = tl.load(k_pool_ptr + offs, mask=kv_mask, other=0.0)
            s = tile_dot(q, tl.trans(k), INTERPRETED) * scale  # [BLOCK_M, BLOCK_N]
            causal = (keys[None, :] <= pos[:, None]) & k_mask[None, :]
            s = tl.where(causal, s, float("-inf"))  # rows past q_len may see no key yet
            v = tl.load(v_pool_ptr + offs, mask=kv_mask, other=0.0)
            m_i, l_i, acc = softmax_step(s, v, m_i, l_i, acc, INTERPRETED)
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + q_rows[:, None] * o_stride_t + h * o_stride_h + d[None, :],
                 round_to(out, out_ptr.dtype.element_ty, INTERPRETED), mask=qd_mask)


def prefill_attention(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
    query_start: torch.Tensor, seq_lens: torch.Tensor, max_query_len: int, scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [T, Hq, D] flat rows; pools: [num_blocks, block_size, Hkv, D] contiguous; block_tables:
    [R, max_blocks] int; query_start: [R + 1] int; seq_lens: [R] int; ``max_query_len``: the
    longest request's row count (sizes the grid; a host int, so no device sync). Returns [T, Hq, D]."""
    t, n_q, d = q.shape
    q, out, page, n_kv = launch_inputs(q, k_pool, out)
    n_req = seq_lens.shape[0]
    if t == 0 or n_req == 0:
        return out
    grid = (n_req, triton.cdiv(max_query_len, BLOCK_M), n_q)
    _prefill_kernel[grid](
        q, k_pool, v_pool, block_tables, query_start, seq_lens, out, scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        GROUP=n_q // n_kv, HKV=n_kv, D=d, PAGE=page,
        BLOCK_M=BLOCK_M, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_N=BLOCK_N,
        INTERPRETED=interpreting(),
    )
    return out
