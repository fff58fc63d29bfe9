"""bf16 GEMV for decode on x86 CPUs (``bf16_linear_cpu.cpp``): vdpbf16ps where the CPU has AVX512-BF16,
else AVX2 + FMA, with a float32 GEMM for calls of 40 rows or more there (the instruction set follows
the CPU's flags at build time, ``-march=native``).

``load_bf16_gemv()`` returns the compiled op ``gemv(x [M, K] bf16, weight [N, K] bf16) -> [M, N]``
(K a multiple of 32, both contiguous), or ``None`` when it cannot run here (CPU without
AVX2 and FMA, no compiler, failed build; the reason is logged once) so that callers keep
``F.linear``. Its plain-torch twin is ``F.linear`` itself: the op computes the same sums in float32
in another order, and the tests hold it to that.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch

from swiftlm.backends.cpu.kernels.build import dtype_name, try_load_cpu_op_library, try_load_op_variant

SOURCE = Path(__file__).with_name("bf16_linear_cpu.cpp")
REQUIRED_CPU_FLAGS = ("avx2", "fma")  # every AVX512-BF16 CPU has both; it takes vdpbf16ps there
K_MULTIPLE = 32  # the kernel reads K in vectors of 32 bf16 values


def supports(dtype: torch.dtype, in_features: int) -> str | None:
    """None if a linear of ``dtype`` weights and ``in_features`` runs on the kernel, else why not."""
    if dtype != torch.bfloat16:
        return f"{dtype_name(dtype)} weights (the kernel takes bfloat16)"
    if in_features % K_MULTIPLE:
        return f"in_features {in_features} is not a multiple of {K_MULTIPLE}"
    return None


@cache
def load_bf16_gemv() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """The compiled op (built on first use, ~10 s, then loaded from the disk cache) or None."""
    if not try_load_cpu_op_library("swiftlm_bf16", SOURCE, "bf16 GEMV kernel", REQUIRED_CPU_FLAGS):
        return None
    return torch.ops.swiftlm_bf16.gemv.default


def load_build_variant(namespace: str, cflags: tuple[str, ...]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """A second build of the source under its own op namespace, compiled with ``cflags`` added to the
    usual ones (``-mno-avx512f``: the AVX2 code, GEMM for many rows included, on an AVX-512 CPU), or None."""
    if not try_load_op_variant(namespace, SOURCE, "bf16 GEMV kernel", REQUIRED_CPU_FLAGS, "SWIFTLM_BF16_NS", cflags):
        return None
    return getattr(torch.ops, namespace).gemv.default
