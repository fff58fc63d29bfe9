"""Every decoder layer of a decode step (bf16 activations; bf16, int8 or int4 weights) in one C++
call (``decode_cpu.cpp``).

``load_decode_layers()`` returns the op ``decode_layers`` (schema in the source), or ``None`` when
it or one of the kernels it calls (bf16 GEMV, fused ops, paged attention) cannot run here; callers
then keep the Python loop of ``backends/fused_forward.py``, which runs the same kernels in the same
order and is what the tests hold this op to, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch

from swiftlm.backends.cpu.kernels.attention_cpu import load_paged_attention
from swiftlm.backends.cpu.kernels.attention_cpu import supports as attention_supports
from swiftlm.backends.cpu.kernels.bf16_linear_cpu import load_bf16_gemv
from swiftlm.backends.cpu.kernels.build import CPU_CFLAGS, dtype_name, try_load_cpu_op_library
from swiftlm.backends.cpu.kernels.fused_cpu import load_fused_ops

SOURCE = Path(__file__).with_name("decode_cpu.cpp")
WIDTH_MULTIPLE = 32  # every GEMV input (hidden, heads * head_dim, intermediate) in vectors of 32


def supports(dtype: torch.dtype, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int,
             intermediate: int) -> str | None:
    """None if the op runs a model of this shape (its linears aside, see ``DecodeLayers``), else why not."""
    if dtype != torch.bfloat16:
        return f"{dtype_name(dtype)} activations (the op takes bfloat16)"
    for name, width in (("hidden_size", hidden), ("heads * head_dim", n_heads * head_dim),
                        ("intermediate_size", intermediate)):
        if width % WIDTH_MULTIPLE:
            return f"{name} {width} is not a multiple of {WIDTH_MULTIPLE}"
    return attention_supports(dtype, head_dim, n_heads, n_kv_heads)


@cache
def load_decode_layers() -> Callable[..., torch.Tensor] | None:
    """The compiled op (built on first use, then cached on disk), or None when unavailable."""
    if load_bf16_gemv() is None or load_fused_ops() is None or load_paged_attention() is None:
        return None
    # the flags of the fused ops, whose row code (fused_rows.h) it shares: no contracted multiply-adds
    if not try_load_cpu_op_library("swiftlm_decode", SOURCE, "decode layers op", cflags=(*CPU_CFLAGS, "-ffp-contract=off")):
        return None
    return torch.ops.swiftlm_decode.decode_layers.default
