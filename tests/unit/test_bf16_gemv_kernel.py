"""The bf16 GEMV kernel (the build for this CPU and, on AVX-512 CPUs, the AVX2 one with its float32 GEMM
for 16 rows or more) against float64 sums of the same bf16 values, and GemvLinear's dispatch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from swiftlm.backends.cpu.kernels.bf16_linear_cpu import (
    REQUIRED_CPU_FLAGS,
    load_bf16_gemv,
    load_build_variant,
)
from swiftlm.backends.cpu.limits import RowLimits
from swiftlm.backends.cpu.linear import GemvLinear, can_pack, use_gemv
from swiftlm.platform import cpu_flags
from tests.helpers.bf16_sums import bad_linear_inputs, check_against_float64
from tests.helpers.cpu_kernels import build_or_skip


@pytest.fixture(scope="module", params=["native", "avx2"])
def gemv(request: pytest.FixtureRequest):
    return build_or_skip(request.param, load_bf16_gemv, load_build_variant, "swiftlm_bf16_avx2", REQUIRED_CPU_FLAGS,
                         "bf16 GEMV kernel")


def test_kernel_loads_on_avx2_machines() -> None:
    if not all(f in cpu_flags() for f in REQUIRED_CPU_FLAGS):
        pytest.skip("no AVX2 + FMA on this CPU")
    assert load_bf16_gemv() is not None


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 9, 16, 23, 39, 40, 41, 42, 43, 44, 45, 70])  # passes of 4 rows, every remainder; the GEMM (40+) in blocks of 6, every last-block size
@pytest.mark.parametrize(("n", "k"), [(37, 32), (64, 96), (130, 1024), (4, 3072)])
def test_gemv_matches_float64(gemv, m: int, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    y = gemv(x, w)
    check_against_float64(y, x, w)
    # and agrees with F.linear almost everywhere (both are float32 sums rounded once to bf16)
    assert (y == F.linear(x, w)).float().mean() > 0.9


@pytest.mark.parametrize(("n", "k"), [(37, 96), (131, 1024), (3, 3072)])
def test_gemv_rows_do_not_depend_on_the_batch(gemv, n: int, k: int) -> None:
    # one or two rows may take another reading order (whole weight rows, bf16_gemv.h) than larger
    # calls; every output is still the same sum in the same order, so the same bits
    g = torch.Generator().manual_seed(n + k)
    x = torch.randn(7, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    # a row whose float32 sum depends on its order: 2^24, then 1 (lost beside 2^24), then -2^24 in
    # the same lane of three 32-value steps gives 0 summed in order and 1 in any other grouping
    x[:, [0, 32, 64]] = 1.0
    w[0] = 0.0
    w[0, [0, 32, 64]] = torch.tensor([2.0**24, 1.0, -(2.0**24)]).bfloat16()
    together = gemv(x, w)
    assert torch.all(together[:, 0] == 0)
    for i in range(7):
        assert torch.equal(gemv(x[i : i + 1].contiguous(), w)[0], together[i])
    for i in range(0, 6, 2):
        assert torch.equal(gemv(x[i : i + 2].contiguous(), w), together[i : i + 2])


def test_many_rows_do_not_depend_on_the_other_rows(gemv) -> None:
    # calls of 40 rows or more (the AVX2 build's GEMM, blocks of 6 rows, k in chunks of 256): a row's
    # result is the same bits whichever rows share its call and block
    g = torch.Generator().manual_seed(5)
    x = torch.randn(101, 640, generator=g).bfloat16()
    w = torch.randn(37, 640, generator=g).bfloat16()
    together = gemv(x, w)
    assert torch.equal(gemv(x[5:50].contiguous(), w), together[5:50])
    assert torch.equal(gemv(x[60:].contiguous(), w), together[60:])


def test_gemv_rounds_half_to_even_and_keeps_special_values(gemv) -> None:
    k = 32
    x = torch.zeros(1, k, dtype=torch.bfloat16)
    x[0, 0] = 1.0
    w = torch.zeros(4, k, dtype=torch.bfloat16)
    w[0, 0] = float("inf")
    w[1, 0] = float("nan")
    w[2, 0] = -0.0
    w[3, 0] = 3.0
    y = gemv(x, w)[0]
    assert y[0] == float("inf") and torch.isnan(y[1]) and y[2] == 0 and y[3] == 3.0


@pytest.mark.parametrize(("x", "w", "message"), bad_linear_inputs())
def test_gemv_rejects_bad_inputs(gemv, x, w, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        gemv(x, w)


def test_gemv_linear_dispatch(gemv) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 40, bias=True).bfloat16()
    limits = RowLimits.for_kernels(gemv=True, amx_capacity=None, quant=False)
    layer = GemvLinear(linear, gemv, limits)
    assert layer.gemv_max_rows == limits.gemv > 1
    for rows in range(1, limits.gemv + 1):  # the kernel, plus the bias rounded like torch's add
        x = torch.randn(3, rows, 64).bfloat16()[1]
        expect = gemv(x, linear.weight.detach()).add_(linear.bias.detach())
        assert torch.equal(layer(x), expect)
    x = torch.randn(2, limits.gemv, 64).bfloat16()  # more rows: the dense matmul on the same weight
    assert torch.equal(layer(x), F.linear(x, linear.weight, linear.bias))
    if not can_pack(torch.bfloat16):  # an AVX2-only CPU: oneDNN has no bf16 path to pack for
        with pytest.raises(ValueError, match="cannot pack"):
            GemvLinear(linear, gemv, limits, packed=True)
        return
    packed = GemvLinear(linear, gemv, limits, packed=True)
    assert packed.packed_weight is not None
    torch.testing.assert_close(packed(x), F.linear(x, linear.weight, linear.bias), rtol=2e-2, atol=2e-2)


def test_use_gemv_takes_only_layers_the_kernel_can_run(gemv) -> None:
    model = nn.Sequential(nn.Linear(64, 8), nn.Linear(8, 64), nn.Linear(64, 64)).bfloat16()
    model.append(nn.Linear(64, 64))  # float32: left alone
    count, left = use_gemv(model, gemv, RowLimits.for_kernels(gemv=True, amx_capacity=None, quant=False))
    assert count == 2
    assert [type(m).__name__ for m in model] == ["GemvLinear", "Linear", "GemvLinear", "Linear"]
    assert left == ["1: in_features 8 is not a multiple of 32", "3: float32 weights (the kernel takes bfloat16)"]
