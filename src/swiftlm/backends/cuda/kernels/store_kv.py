"""Triton kernel: write a step's new K/V rows into the paged pools at their slots.

A slot is ``block_id * block_size + offset`` (``backends/kv_cache.py``); a negative slot (a padded
row of a captured decode graph) writes nothing. Reference: ``KVCache.store`` (``index_copy_``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from swiftlm.backends.cuda.kernels.tile_ops import interpreting, round_to


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, k_pool_ptr, v_pool_ptr, slot_ptr, k_row_stride, v_row_stride,
    WIDTH: tl.constexpr, BLOCK: tl.constexpr, INTERPRETED: tl.constexpr,
):
    t = tl.program_id(0)  # one token per program
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        cols = tl.arange(0, BLOCK)  # the token's Hkv * D values, padded to a power of 2
        mask = cols < WIDTH
        k = tl.load(k_ptr + t * k_row_stride + cols, mask=mask)
        v = tl.load(v_ptr + t * v_row_stride + cols, mask=mask)
        tl.store(k_pool_ptr + slot * WIDTH + cols, round_to(k, k_pool_ptr.dtype.element_ty, INTERPRETED), mask=mask)
        tl.store(v_pool_ptr + slot * WIDTH + cols, round_to(v, v_pool_ptr.dtype.element_ty, INTERPRETED), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [T, Hkv, D] with each token's Hkv * D values contiguous (any row stride)."""
    if x.stride(2) != 1 or x.stride(1) != x.shape[2]:
        x = x.contiguous()
    return x


def store_kv(k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor) -> None:
    """k, v: [T, Hkv, D]; pools: [num_blocks, block_size, Hkv, D] contiguous; slots: [T] int."""
    t, n_kv, d = k.shape
    if t == 0:
        return
    k, v = _rows(k), _rows(v)
    width = n_kv * d
    _store_kv_kernel[(t,)](
        k, v, k_pool, v_pool, slots, k.stride(0), v.stride(0), WIDTH=width, BLOCK=triton.next_power_of_2(width),
        INTERPRETED=interpreting(),
    )
