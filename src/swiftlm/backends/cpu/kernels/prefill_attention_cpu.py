"""Prefill attention over the paged KV cache (``prefill_attention_cpu.cpp``): bf16 on ``vdpbf16ps`` on CPUs
with AVX512-BF16; float32, and bf16 widened to float32, on CPUs with AVX-512F or AVX2 + FMA.

One request's chunk of prompt rows attends to its context read from the pools through its block
table, with no gather of the blocks and no repeat of the KV heads: the op packs the context's K and
V rows once a call and runs a flash attention over them (scores and P.V in float32 registers; in bf16
on ``vdpbf16ps`` with the softmax weights rounded to bf16 as torch's CPU flash attention rounds them
for bf16 inputs; elsewhere on FMAs), causal and bottom-right aligned::

    paged_prefill_attention(q [T, Hq, D] bf16 | float32, k_pool [N, bs, Hkv, D], v_pool [N, bs, Hkv, D],
                            block_table [max_blocks] int64, seq_len: int, scale: float,
                            k_scales [N, bs, Hkv] float32 = None, v_scales = None) -> [T, Hq, D] q's dtype

Row ``r`` of q sits at position ``seq_len - T + r`` and sees keys ``0 .. seq_len - T + r``; token
``t`` is ``pool[block_table[t // bs], t % bs]``. The pools are q's dtype, or 8-bit (int8,
float8_e4m3fn, float8_e5m2: the small KV cache) with their scale pools, a row's values times its scale
in q's dtype as ``dequantize_kv`` computes them. ``Hq % Hkv == 0`` with a GQA group of at most 32
query heads, ``D`` in 64, 128 or 256; the block table is bounds-checked (RuntimeError).

``load_prefill_attention()`` returns the op, or ``None`` where it cannot run (a CPU without AVX2, no
compiler, a failed build), the reason logged once; ``supports()`` says which models it takes on this
CPU. Callers keep the torch path (gather the blocks, then SDPA), which is the test oracle. Measured in
BENCHMARKS.md.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch

from swiftlm.backends.cpu.kernels.build import dtype_name, try_load_cpu_op_library, try_load_op_variant
from swiftlm.platform import cpu_flags

SOURCE = Path(__file__).with_name("prefill_attention_cpu.cpp")
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")  # float32 arithmetic, for float32 and bf16
BF16_CPU_FLAGS = ("avx512f", "avx512bw", "avx512_bf16")  # bf16 on vdpbf16ps
HEAD_DIMS = (64, 128, 256)
MAX_GROUP = 32  # query heads per kv head in one task

PagedPrefillAttention = Callable[..., torch.Tensor]


def supports(dtype: torch.dtype, head_dim: int, n_heads: int, n_kv_heads: int,
             flags: frozenset[str] | None = None) -> str | None:
    """None if the kernel takes this attention shape's prefill on a CPU with ``flags`` (default: this
    one's), else why not. It runs wherever the op loads (AVX2 + FMA + F16C), except bf16 on CPUs with
    AMX: there torch's flash attention runs its matmuls on AMX tiles, and the kernel was measured
    against it only on CPUs without, so it leaves them the bf16 prefill."""
    flags = cpu_flags() if flags is None else flags
    if dtype == torch.bfloat16:
        if "amx_bf16" in flags:
            return "AMX: torch's flash attention takes the bfloat16 prefill"
    elif dtype != torch.float32:
        return f"{dtype_name(dtype)} activations (the kernel takes bfloat16 or float32)"
    if head_dim not in HEAD_DIMS:
        return f"head_dim {head_dim} is not one of {HEAD_DIMS}"
    if n_kv_heads <= 0 or n_heads % n_kv_heads:
        return f"{n_heads} query heads are not a multiple of {n_kv_heads} KV heads"
    if n_heads // n_kv_heads > MAX_GROUP:
        return f"a GQA group of {n_heads // n_kv_heads} query heads is over {MAX_GROUP}"
    return None


def instruction_set(dtype: torch.dtype) -> str:
    """What the kernel computes ``dtype`` with on this CPU: "AVX512-BF16", "AVX-512" or "AVX2" (float32
    arithmetic, a bf16 q widened)."""
    flags = cpu_flags()
    if dtype == torch.bfloat16 and all(f in flags for f in BF16_CPU_FLAGS):
        return "AVX512-BF16"
    return "AVX-512" if "avx512f" in flags else "AVX2"


@cache
def load_prefill_attention() -> PagedPrefillAttention | None:
    """The compiled op (built on first use, then cached on disk), or None when unavailable."""
    if not try_load_cpu_op_library("swiftlm_prefill_attention", SOURCE, "prefill attention kernel",
                                   REQUIRED_CPU_FLAGS):
        return None
    return torch.ops.swiftlm_prefill_attention.paged_prefill_attention.default


def load_build_variant(namespace: str, cflags: tuple[str, ...]) -> PagedPrefillAttention | None:
    """A second build of the source under its own op namespace, compiled with ``cflags`` added to the
    usual ones (``-mno-avx512f``: the AVX2 code on an AVX-512 CPU, for its tests), or None."""
    if not try_load_op_variant(namespace, SOURCE, "prefill attention kernel", REQUIRED_CPU_FLAGS,
                               "SWIFTLM_PREFILL_NS", cflags):
        return None
    return getattr(torch.ops, namespace).paged_prefill_attention.default
