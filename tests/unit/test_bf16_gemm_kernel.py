"""The bf16 GEMM for prefill rows (AVX-512 CPUs without AMX), on each arithmetic this CPU's build holds,
against float64 sums of the same bf16 values; its load-time choice; GemvLinear's rows through it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from swiftlm.backends.cpu.kernels.bf16_linear_cpu import load_bf16_gemv
from swiftlm.backends.cpu.kernels.gemm_cpu import (
    FMA32_ONLY_MIN_ROWS,
    REQUIRED_CPU_FLAGS,
    available_arithmetics,
    gemm_op,
    load_bf16_gemm,
    small_call_rows,
)
from swiftlm.backends.cpu.limits import RowLimits
from swiftlm.backends.cpu.linear import GemvLinear
from swiftlm.platform import cpu_flags
from tests.helpers.bf16_sums import bad_linear_inputs, check_against_float64
from tests.helpers.cpu_kernels import kernel_or_skip


def _arithmetics() -> list[str]:
    if not all(f in cpu_flags() for f in REQUIRED_CPU_FLAGS):
        return []
    return ["dpbf16", "fma32"] if "avx512_bf16" in cpu_flags() else ["fma32"]


@pytest.fixture(scope="module", params=["dpbf16", "fma32"])
def gemm(request: pytest.FixtureRequest):
    kernel_or_skip(load_bf16_gemm, REQUIRED_CPU_FLAGS, "bf16 GEMM kernel")
    if request.param not in available_arithmetics():
        pytest.skip(f"{request.param} is not in this CPU's build (no AVX512-BF16)")
    return gemm_op(request.param)


def test_the_build_holds_the_arithmetics_of_the_cpu() -> None:
    kernel_or_skip(load_bf16_gemm, REQUIRED_CPU_FLAGS, "bf16 GEMM kernel")
    assert available_arithmetics() == _arithmetics()


@pytest.mark.parametrize("m", [1, 15, 16, 17, 33, 513])  # 16-row vectors, pairs of them, every tail
@pytest.mark.parametrize(("n", "k"), [(13, 32), (25, 96), (100, 1056), (12, 3072)])  # 12-row weight blocks
def test_gemm_matches_float64(gemm, m: int, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    y = gemm(x, w)
    check_against_float64(y, x, w)
    assert (y == F.linear(x, w)).float().mean() > 0.9  # both float32 sums rounded once to bf16


def test_rows_do_not_depend_on_the_other_rows(gemm) -> None:
    # a row comes out the same bits whichever rows share its call, among calls of up to 24 rows (vectors
    # over k: dpbf16) and among calls of 25 or more (vectors over rows); the two forms add a row's
    # products in different orders, as the GEMV and the GEMM do
    g = torch.Generator().manual_seed(5)
    x = torch.randn(70, 640, generator=g).bfloat16()
    w = torch.randn(37, 640, generator=g).bfloat16()
    together = gemm(x, w)
    assert torch.equal(gemm(x[5:35].contiguous(), w), together[5:35])
    assert torch.equal(gemm(x[30:].contiguous(), w), together[30:])
    small = gemm(x[:24].contiguous(), w)
    assert torch.equal(gemm(x[3:10].contiguous(), w), small[3:10])
    assert torch.equal(gemm(x[7:8].contiguous(), w), small[7:8])
    assert torch.equal(gemm(x[1:18].contiguous(), w), small[1:18])


def test_gemm_keeps_special_values(gemm) -> None:
    x = torch.zeros(17, 32, dtype=torch.bfloat16)
    x[:, 0] = 1.0
    w = torch.zeros(4, 32, dtype=torch.bfloat16)
    w[0, 0], w[1, 0], w[2, 0], w[3, 0] = float("inf"), float("nan"), -0.0, 3.0
    y = gemm(x, w)
    assert (y[:, 0] == float("inf")).all() and torch.isnan(y[:, 1]).all() and (y[:, 2] == 0).all()
    assert (y[:, 3] == 3.0).all()


@pytest.mark.parametrize(("x", "w", "message"), bad_linear_inputs())
def test_gemm_rejects_bad_inputs(gemm, x, w, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        gemm(x, w)


def test_load_times_each_arithmetic_and_keeps_the_faster() -> None:
    chosen = kernel_or_skip(load_bf16_gemm, REQUIRED_CPU_FLAGS, "bf16 GEMM kernel")
    assert set(chosen.timings) == set(available_arithmetics())
    assert chosen.arith == max(chosen.timings, key=chosen.timings.__getitem__)
    assert all(g > 0 for g in chosen.timings.values()) and chosen.arith in chosen.describe()
    forced = load_bf16_gemm("fma32")
    assert forced.arith == "fma32" and forced.timings == {}
    # small calls run on vdpbf16ps where the build has it; a build without takes larger calls only
    assert small_call_rows() == (24 if "dpbf16" in available_arithmetics() else 0)
    assert chosen.min_rows == (1 if small_call_rows() else FMA32_ONLY_MIN_ROWS)
    with pytest.raises(ValueError, match="not available"):
        load_bf16_gemm("fp16")


def test_gemv_linear_sends_the_rows_above_the_gemv_to_the_gemm(gemm) -> None:
    gemv = kernel_or_skip(load_bf16_gemv, ("avx2", "fma"), "bf16 GEMV kernel")
    torch.manual_seed(0)
    linear = nn.Linear(64, 40, bias=True).bfloat16()
    limits = RowLimits.for_kernels(gemv=True, amx_capacity=None, quant=False, gemm=True)
    assert limits.gemm and "GEMM 7+ rows" in limits.describe_bf16()
    calls: list[int] = []

    def counted(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return gemm(x, w)

    layer = GemvLinear(linear, gemv, limits, gemm=counted)
    for rows in (1, limits.gemv, limits.gemv + 1, 40):
        x = torch.randn(rows, 64).bfloat16()
        y = layer(x)
        if rows > limits.gemv:
            assert calls[-1] == rows
            assert torch.equal(y, gemm(x, linear.weight.detach()).add_(linear.bias.detach()))
    assert calls == [limits.gemv + 1, 40]
    assert not layer.builds_primitives  # every row count on swiftlm's kernels: no oneDNN warm-up
    # a GEMM that starts at 32 rows: 7-31 rows go to oneDNN (F.linear), as the warm-up then knows
    late = GemvLinear(linear, gemv, limits, gemm=counted, gemm_min_rows=32)
    x = torch.randn(20, 64).bfloat16()
    assert torch.equal(late(x), F.linear(x, linear.weight, linear.bias)) and calls == [limits.gemv + 1, 40]
    assert late.builds_primitives
    # with AMX (its kernel takes those rows, oneDNN's AMX matmul the rest) the GEMM is not used
    assert not RowLimits.for_kernels(gemv=True, amx_capacity=32, quant=False, gemm=True).gemm
