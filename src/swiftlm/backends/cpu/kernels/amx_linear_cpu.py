"""bf16 linear for small batches on CPUs with AMX (``amx_linear_cpu.cpp``): 2 rows up to its capacity.

``load_amx_kernel()`` returns an ``AmxKernel``: the compiled op ``linear(x [M, K] bf16, weight [N, K]
bf16) -> [M, N]`` (M <= ``max_rows``, K a multiple of 32) and ``max_rows``, the capacity the kernel
states (``swiftlm_amx::kMaxRows`` in ``amx_linear.h``, read through the op ``max_rows()``); or
``None`` when it cannot run here: a CPU without AMX, no compiler, a failed build, or an OS that
does not grant the process AMX tile data (checked by running the op once against ``F.linear``). The
reason is logged once; callers keep their other paths. ``load_amx_linear()`` and ``amx_capacity()``
return one part each (or None). Its plain twin is ``F.linear``: the op sums the same exact products
in float32 in another order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
import torch.nn.functional as F

from swiftlm.backends.cpu.kernels.build import CPU_CFLAGS, try_load_cpu_op_library

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("amx_linear_cpu.cpp")
REQUIRED_CPU_FLAGS = ("avx512f", "amx_tile", "amx_bf16")


@dataclass(frozen=True, slots=True)
class AmxKernel:
    linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    max_rows: int  # the most rows one call of ``linear`` takes


@cache
def load_amx_kernel() -> AmxKernel | None:
    """The compiled op and its capacity (built on first use, then cached on disk), or None when unavailable."""
    cflags = (*CPU_CFLAGS, "-mamx-tile", "-mamx-bf16")
    if not try_load_cpu_op_library("swiftlm_amx", SOURCE, "AMX linear kernel", REQUIRED_CPU_FLAGS, cflags=cflags):
        return None
    op = torch.ops.swiftlm_amx.linear.default
    max_rows = int(torch.ops.swiftlm_amx.max_rows.default())
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(9, 64, generator=g).bfloat16(), torch.randn(40, 64, generator=g).bfloat16()
    try:
        got = op(x, w).float()
    except RuntimeError as exc:
        logger.info("AMX linear kernel unavailable (%s); using the other paths", exc)
        return None
    if not torch.allclose(got, F.linear(x, w).float(), rtol=1e-2, atol=1e-2):
        logger.warning("AMX linear kernel disagrees with F.linear on its self-check; not using it")
        return None
    return AmxKernel(linear=op, max_rows=max_rows)


def load_amx_linear() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """The compiled op, or None when unavailable."""
    kernel = load_amx_kernel()
    return None if kernel is None else kernel.linear


def amx_capacity() -> int | None:
    """The most rows one call of the op takes, as the kernel states it, or None when unavailable."""
    kernel = load_amx_kernel()
    return None if kernel is None else kernel.max_rows
