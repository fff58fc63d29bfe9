"""Int8 / int4 weight-only linear kernels for CPUs with AVX512-VNNI (``quant_cpu.cpp``).

``load_quant_kernels()`` returns the compiled ops as a ``QuantOps`` (``backends/quant_ops.py``,
where their plain torch twins define the math), or ``None`` when they cannot run here (CPU
without AVX512-VNNI, no compiler, failed build; the reason is logged once). The compiled ops take
float32 or bfloat16 activations (any M; the GEMVs are meant for small M: decode batches and short
chunks) and return x's dtype.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

from swiftlm.backends.cpu.kernels.build import try_load_cpu_op_library
from swiftlm.backends.quant_ops import QuantOps

SOURCE = Path(__file__).with_name("quant_cpu.cpp")
REQUIRED_CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
K_MULTIPLE = 32  # in_features must be a multiple of the activation block


def supports(in_features: int) -> str | None:
    """None if a linear with ``in_features`` can run on these kernels, else why not."""
    return None if in_features % K_MULTIPLE == 0 else f"in_features {in_features} is not a multiple of {K_MULTIPLE}"


@cache
def load_quant_kernels() -> QuantOps | None:
    """The compiled ops (built on first use, ~1 minute, then loaded from the disk cache) or None."""
    if not try_load_cpu_op_library("swiftlm_quant", SOURCE, "quantised linear kernels", REQUIRED_CPU_FLAGS):
        return None
    ops = torch.ops.swiftlm_quant
    return QuantOps(
        quantize_activations=ops.quantize_activations.default,
        fake_quantize_activations=ops.fake_quantize_activations.default,
        int8_gemv=ops.int8_gemv.default,
        int4_gemv=ops.int4_gemv.default,
        int8_dequantize=ops.int8_dequantize.default,
        int4_dequantize=ops.int4_dequantize.default,
    )


