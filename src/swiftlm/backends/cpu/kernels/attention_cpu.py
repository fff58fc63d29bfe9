"""Decode attention over the paged KV cache on CPU (``paged_attention_cpu.cpp``): AVX-512 item
runners where the CPU has AVX-512 F and BW, AVX2 + FMA + F16C ones elsewhere
(``paged_attention_avx2.h``), chosen at build time by the CPU's flags (``-march=native``).

``load_paged_attention()`` returns the op, or ``None`` when it cannot run here (CPU without
AVX2, FMA and F16C, no compiler, failed build); the reason is logged once at INFO and callers keep the torch
path (gather the blocks, then SDPA with a length mask), which is also the test oracle. The first
call compiles the kernel (~15-20 s on 2 cores) into ``swiftlm.backends.cpu.kernels.build.cache_dir()``; later
processes load the cached library in milliseconds.

The op, for B decoding requests (one query token each)::

    paged_decode_attention(q [B, Hq, D], k_pool [N, bs, Hkv, D], v_pool [N, bs, Hkv, D],
                           block_tables [B, max_blocks] int64 (int32 accepted),
                           seq_lens [B] int64, scale: float,
                           k_scales [N, bs, Hkv] float32 = None, v_scales = None) -> [B, Hq, D]  (dtype of q)

For benchmarks, ``paged_decode_attention_layers(q, k_pools[], v_pools[], block_tables, seq_lens, scale,
k_scales[], v_scales[]) -> out[]`` makes one call per layer back to back from C++, as the fused decode
op does (empty scale lists for pools of q's dtype).

Request ``b`` attends to its first ``seq_lens[b]`` tokens; token ``t`` is
``pool[block_tables[b, t // bs], t % bs]``. q and the pools are all float32 or all bfloat16, or the
pools are 8-bit (int8, float8_e4m3fn or float8_e5m2: the small KV cache, ``backends/kv_quant.py``)
with their scale pools, a row's values times its scale;
``Hq % Hkv == 0``; ``D % 16 == 0``; the pools need unit stride in D only. Dots, softmax and the
weighted V sum are computed in float32 and rounded once to q's dtype; int8 pools with bfloat16 q, on
CPUs with AVX512-VNNI, take integer dot products instead (q rounded to 16 bits of its head's max, the
softmax weights to 16 bits of their tile's max: well below the output's one bf16 rounding). Each K/V row is read once
per (request, kv head), for all query heads of its GQA group; long contexts are split into chunks
whose partial softmax results are merged (flash-decoding), so one request uses every thread of
torch's intra-op pool (``torch.set_num_threads``). A request with ``seq_lens[b] == 0`` gets zeros.
Block ids and lengths are bounds-checked (RuntimeError), so a bad table cannot read outside the pools.

The op is bound by how fast the pools stream from memory; the engine's pools are on transparent
huge pages (``backends/cpu/host_memory.py``). Measured on a 2-core Xeon VM, 28 layers'
pools of a 2048-token context (235 MB, bf16): 15-16 ms from memory, 9.6 ms when they sit in cache.
On a 2-core Zen4 VM, with the pools read in whole rows and L2 prefetches (2026-12-02, the long-context
bench, weights streaming at 30 GB/s): bf16 8.2 ms (29 GB/s), int8 6.3 ms (19 GB/s; halving its
instructions did not make it faster from memory, see BENCHMARKS.md).
The AVX2 item runners on a 2-core Zen3 VM (weights streaming at 16-17 GB/s), 28 layers at 2048
tokens: bf16 24.9 ms (9.4 GB/s), int8 16.6 ms (7.3 GB/s); bound by their arithmetic there.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch

from swiftlm.backends.cpu.kernels.build import dtype_name, try_load_cpu_op_library
from swiftlm.platform import cpu_flags

SOURCE = Path(__file__).with_name("paged_attention_cpu.cpp")
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")  # AVX-512 (F, BW; BF16, VNNI, AMX) is used when present
HEAD_DIM_MULTIPLE = 16  # the kernel reads head_dim in vectors of 16 floats
DTYPES = (torch.float32, torch.bfloat16)


def supports(dtype: torch.dtype, head_dim: int, n_heads: int, n_kv_heads: int) -> str | None:
    """None if the kernel runs this attention shape, else why not (any GQA group size runs)."""
    if dtype not in DTYPES:
        return f"{dtype_name(dtype)} activations (the kernel takes float32 or bfloat16)"
    if head_dim % HEAD_DIM_MULTIPLE:
        return f"head_dim {head_dim} is not a multiple of {HEAD_DIM_MULTIPLE}"
    if n_kv_heads <= 0 or n_heads % n_kv_heads:
        return f"{n_heads} query heads are not a multiple of {n_kv_heads} KV heads"
    return None

def instruction_set() -> str:
    """The instruction set the kernel is built for on this CPU: "AVX-512" or "AVX2"."""
    return "AVX-512" if {"avx512f", "avx512bw"} <= cpu_flags() else "AVX2"


PagedDecodeAttention = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor
]


@cache
def load_paged_attention() -> PagedDecodeAttention | None:
    """The compiled op (built on first use, then cached on disk), or None when unavailable."""
    if not try_load_cpu_op_library("swiftlm_paged_attention", SOURCE, "paged attention kernel", REQUIRED_CPU_FLAGS):
        return None
    return torch.ops.swiftlm_attention.paged_decode_attention.default
