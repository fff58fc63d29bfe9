"""Every decoder layer of a decode step (bf16 activations; bf16, int8 or int4 weights) in one C++
call (``decode_cpu.cpp``).

``load_decode_layers()`` returns the op ``decode_layers`` (schema in the source), or ``None`` when
it or one of the kernels it calls (bf16 GEMV, fused ops, paged attention) cannot run here; callers
then keep the Python loop of ``model/fused_forward.py``, which runs the same kernels in the same
order and is what the tests hold this op to, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch

from swiftlm.kernels.attention_cpu import load_paged_attention
from swiftlm.kernels.bf16_linear_cpu import load_bf16_gemv
from swiftlm.kernels.build import CPU_CFLAGS, try_load_cpu_op_library
from swiftlm.kernels.fused_cpu import load_fused_ops

SOURCE = Path(__file__).with_name("decode_cpu.cpp")


@cache
def load_decode_layers() -> Callable[..., torch.Tensor] | None:
    """The compiled op (built on first use, then cached on disk), or None when unavailable."""
    if load_bf16_gemv() is None or load_fused_ops() is None or load_paged_attention() is None:
        return None
    # the flags of the fused ops, whose row code (fused_rows.h) it shares: no contracted multiply-adds
    if not try_load_cpu_op_library("swiftlm_decode", SOURCE, "decode layers op", cflags=(*CPU_CFLAGS, "-ffp-contract=off")):
        return None
    return torch.ops.swiftlm_decode.decode_layers.default
