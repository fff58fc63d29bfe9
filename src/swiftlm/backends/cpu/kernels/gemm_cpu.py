"""bf16 GEMM for prefill rows on AVX-512 CPUs without AMX (``bf16_gemm_cpu.cpp``, design in ``bf16_gemm.h``).

Two arithmetics: ``dpbf16`` (vdpbf16ps, CPUs with AVX512-BF16) and ``fma32`` (bf16 widened to float32
in registers, float32 FMAs; every AVX-512 CPU). Which one is faster depends on the core, not on its
flags: Zen4 issues vdpbf16ps at full rate (2x the float32 FMA's FLOPs), some Intel cores at half rate
(there float32 FMAs are 2x faster). So ``load_bf16_gemm()`` times both on a prefill-sized matmul when it
loads and keeps the faster (``BF16Gemm.timings`` says what it measured); ``arith`` forces one (tests,
A/B runs). Returns None where the op cannot run (no AVX-512, no compiler, failed build: logged once).
Its plain twin is ``F.linear``: the same float32 sums of exact products in another order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path

import torch

from swiftlm.backends.cpu.kernels.build import try_load_cpu_op_library

SOURCE = Path(__file__).with_name("bf16_gemm_cpu.cpp")
REQUIRED_CPU_FLAGS = ("avx512f", "avx512bw")
ARITHMETICS = {"dpbf16": 0, "fma32": 1}
PROBE_SHAPE = (128, 1024, 1024)  # rows, in_features, out_features of the load-time timing
# Calls of up to 24 rows run on vdpbf16ps with lanes over k (bf16_gemm.h: micro_klanes). A build without
# AVX512-BF16 has only the float32 form, which widens every weight once a call: on a Zen4 VM it ran at
# 23-60 GFLOP/s at 8-16 rows and 133-145 at 32, where oneDNN ran at 145-301. There the GEMM takes calls of
# FMA32_ONLY_MIN_ROWS rows or more (a guess for such CPUs, not measured on one) and oneDNN the rest.
FMA32_ONLY_MIN_ROWS = 64


@dataclass(frozen=True, slots=True)
class BF16Gemm:
    linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x [M, K] bf16, weight [N, K] bf16) -> [M, N]
    arith: str  # the arithmetic ``linear`` runs on
    min_rows: int = 1  # the fewest rows a call should bring (fewer go to oneDNN)
    timings: dict[str, float] = field(default_factory=dict)  # arithmetic -> GFLOP/s measured at load

    def describe(self) -> str:
        """E.g. "dpbf16 (measured GFLOP/s: dpbf16 423, fma32 193)", and the rows it starts at when not 1."""
        measured = ", ".join(f"{a} {g:.0f}" for a, g in self.timings.items())
        rows = f", calls of {self.min_rows}+ rows" if self.min_rows > 1 else ""
        return f"{self.arith}{rows}" + (f" (measured GFLOP/s: {measured})" if measured else "")


def available_arithmetics() -> list[str]:
    """The arithmetics this CPU's build of the op holds ([] when it does not load)."""
    if not _load_library():
        return []
    codes = {code: name for name, code in ARITHMETICS.items()}
    return [codes[c] for c in torch.ops.swiftlm_gemm.arithmetics.default()]


def small_call_rows() -> int:
    """Calls of up to this many rows run on vdpbf16ps with vectors over k whichever arithmetic is asked
    (0: a build without AVX512-BF16)."""
    return int(torch.ops.swiftlm_gemm.small_call_rows.default()) if _load_library() else 0


@cache
def _load_library() -> bool:
    return try_load_cpu_op_library("swiftlm_gemm", SOURCE, "bf16 GEMM kernel", REQUIRED_CPU_FLAGS)


def gemm_op(arith: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The op bound to one arithmetic (which must be in ``available_arithmetics()``)."""
    return partial(torch.ops.swiftlm_gemm.gemm.default, arith=ARITHMETICS[arith])


def time_arithmetic(arith: str, shape: tuple[int, int, int] = PROBE_SHAPE, repeats: int = 5) -> float:
    """GFLOP/s of the op on ``arith`` over ``shape`` (rows, K, N): the best of ``repeats`` after a warm-up."""
    m, k, n = shape
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    op = gemm_op(arith)
    op(x, w)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        op(x, w)
        best = min(best, time.perf_counter() - t0)
    return 2 * m * k * n / best / 1e9


@cache
def load_bf16_gemm(arith: str | None = None) -> BF16Gemm | None:
    """The op on the faster arithmetic of this CPU (timed here, ~20 ms), or on ``arith``; None when the
    op cannot run here."""
    arithmetics = available_arithmetics()
    if not arithmetics:
        return None
    min_rows = 1 if small_call_rows() else FMA32_ONLY_MIN_ROWS
    if arith is not None:
        if arith not in arithmetics:
            raise ValueError(f"bf16 GEMM arithmetic {arith!r} is not available here; have {', '.join(arithmetics)}")
        return BF16Gemm(gemm_op(arith), arith, min_rows)
    timings = {a: time_arithmetic(a) for a in arithmetics}
    best = max(timings, key=timings.__getitem__)
    return BF16Gemm(gemm_op(best), best, min_rows, timings)

