"""Prefill attention over the paged KV cache on CPUs with AVX512-BF16 (``prefill_attention_cpu.cpp``).

One request's chunk of prompt rows attends to its context read from the pools through its block
table, with no gather of the blocks and no repeat of the KV heads: the op packs the context's K and
V rows for ``vdpbf16ps`` once a call and runs a flash attention over them (scores and P.V in float32
registers, the softmax weights rounded to bf16 as torch's CPU flash attention rounds them for bf16
inputs), causal and bottom-right aligned::

    paged_prefill_attention(q [T, Hq, D] bf16, k_pool [N, bs, Hkv, D], v_pool [N, bs, Hkv, D],
                            block_table [max_blocks] int64, seq_len: int, scale: float,
                            k_scales [N, bs, Hkv] float32 = None, v_scales = None) -> [T, Hq, D] bf16

Row ``r`` of q sits at position ``seq_len - T + r`` and sees keys ``0 .. seq_len - T + r``; token
``t`` is ``pool[block_table[t // bs], t % bs]``. The pools are bf16, or 8-bit (int8, float8_e4m3fn,
float8_e5m2: the small KV cache) with their scale pools, a row's values times its scale rounded to
bf16 as ``dequantize_kv`` rounds them. ``Hq % Hkv == 0`` with a GQA group of at most 32 query heads,
``D`` in 64, 128 or 256; the block table is bounds-checked (RuntimeError).

``load_prefill_attention()`` returns the op, or ``None`` where it cannot run (a CPU without AVX-512
BF16, no compiler, a failed build), the reason logged once; callers keep the torch path (gather the
blocks, then SDPA), which is the test oracle. Measured in BENCHMARKS.md.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch

from swiftlm.backends.cpu.kernels.build import dtype_name, try_load_cpu_op_library
from swiftlm.platform import cpu_flags

SOURCE = Path(__file__).with_name("prefill_attention_cpu.cpp")
REQUIRED_CPU_FLAGS = ("avx512f", "avx512bw", "avx512_bf16")
HEAD_DIMS = (64, 128, 256)
MAX_GROUP = 32  # query heads per kv head in one task

PagedPrefillAttention = Callable[..., torch.Tensor]


def supports(dtype: torch.dtype, head_dim: int, n_heads: int, n_kv_heads: int, amx: bool | None = None) -> str | None:
    """None if the kernel takes this attention shape's prefill, else why not. On CPUs with AMX (``amx``:
    default, this CPU's flags) torch's flash attention runs its matmuls on AMX tiles; the kernel's
    ``vdpbf16ps`` was measured against it only on CPUs without, so it leaves them the prefill."""
    if amx if amx is not None else "amx_bf16" in cpu_flags():
        return "AMX: torch's flash attention takes the prefill"
    if dtype != torch.bfloat16:
        return f"{dtype_name(dtype)} activations (the kernel takes bfloat16)"
    if head_dim not in HEAD_DIMS:
        return f"head_dim {head_dim} is not one of {HEAD_DIMS}"
    if n_kv_heads <= 0 or n_heads % n_kv_heads:
        return f"{n_heads} query heads are not a multiple of {n_kv_heads} KV heads"
    if n_heads // n_kv_heads > MAX_GROUP:
        return f"a GQA group of {n_heads // n_kv_heads} query heads is over {MAX_GROUP}"
    return None


@cache
def load_prefill_attention() -> PagedPrefillAttention | None:
    """The compiled op (built on first use, then cached on disk), or None when unavailable."""
    if not try_load_cpu_op_library("swiftlm_prefill_attention", SOURCE, "prefill attention kernel",
                                   REQUIRED_CPU_FLAGS):
        return None
    return torch.ops.swiftlm_prefill_attention.paged_prefill_attention.default
