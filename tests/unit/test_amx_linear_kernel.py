"""The AMX linear kernel (7-32 rows) against float64 sums of the same bf16 values, and GemvLinear's
dispatch to it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from swiftlm.backends.cpu.kernels.amx_linear_cpu import REQUIRED_CPU_FLAGS, amx_capacity, load_amx_linear
from swiftlm.backends.cpu.kernels.bf16_linear_cpu import load_bf16_gemv
from swiftlm.backends.cpu.limits import RowLimits
from swiftlm.backends.cpu.linear import GemvLinear
from swiftlm.platform import cpu_flags
from tests.helpers.bf16_sums import check_against_float64


@pytest.fixture(scope="module")
def amx():
    op = load_amx_linear()
    if op is None:
        if all(f in cpu_flags() for f in REQUIRED_CPU_FLAGS):
            pytest.fail("the CPU has AMX but the AMX linear kernel did not load; see the log")
        pytest.skip(f"AMX linear kernel unavailable: CPU lacks {REQUIRED_CPU_FLAGS}")
    return op


# rows: one and two batch tiles, full and partial; n: whole and partial pairs of 16-row weight blocks
@pytest.mark.parametrize("m", [1, 7, 15, 16, 17, 31, 32])
@pytest.mark.parametrize(("n", "k"), [(37, 32), (64, 96), (130, 1024), (4, 3072)])
def test_amx_matches_float64(amx, m: int, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    y = amx(x, w)
    check_against_float64(y, x, w)
    assert (y == F.linear(x, w)).float().mean() > 0.9


def test_amx_reads_only_its_rows(amx) -> None:
    """Views into larger buffers: the kernel must not read past the weight's last row."""
    big = torch.randn(100, 64).bfloat16()
    w = big[:37]  # contiguous, followed by more memory that must not leak into the result
    x = torch.randn(9, 64).bfloat16()
    y = amx(x, w)
    big[37:] = float("nan")
    assert torch.equal(amx(x, w), y) and not y.isnan().any()


@pytest.mark.parametrize(
    ("x", "w", "message"),
    [
        (torch.zeros(8, 48, dtype=torch.bfloat16), torch.zeros(4, 48, dtype=torch.bfloat16), "multiple of 32"),
        (torch.zeros(8, 32), torch.zeros(4, 32), "bfloat16"),
        (torch.zeros(8, 64, dtype=torch.bfloat16)[:, ::2], torch.zeros(4, 32, dtype=torch.bfloat16), "contiguous"),
    ],
)
def test_amx_rejects_bad_inputs(amx, x, w, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        amx(x, w)


def test_amx_rejects_more_rows_than_it_states(amx) -> None:
    rows = amx_capacity()
    assert rows is not None and rows >= 16  # two bf16 tiles of 16 rows at least
    amx(torch.zeros(rows, 32, dtype=torch.bfloat16), torch.zeros(4, 32, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match=f"at most {rows} rows"):
        amx(torch.zeros(rows + 1, 32, dtype=torch.bfloat16), torch.zeros(4, 32, dtype=torch.bfloat16))


def test_gemv_linear_takes_amx_between_the_gemv_and_the_dense_matmul(amx) -> None:
    """With AMX: one row through the GEMV kernel, 2-32 through AMX, more through F.linear."""
    gemv = load_bf16_gemv()
    assert gemv is not None  # every AMX CPU has AVX512-BF16
    seen: list[tuple[str, int]] = []

    def recording(name, op):
        def run(x, w):
            seen.append((name, x.shape[0]))
            return op(x, w)
        return run

    torch.manual_seed(0)
    linear = nn.Linear(64, 40, bias=True).bfloat16()
    max_rows = amx_capacity()
    limits = RowLimits.for_kernels(gemv=True, amx_capacity=max_rows, quant=False)
    layer = GemvLinear(linear, recording("gemv", gemv), limits, amx=recording("amx", amx))
    assert layer.gemv_max_rows == limits.gemv == 1 and layer.amx_max_rows == max_rows
    w, b = linear.weight.detach(), linear.bias.detach()
    for rows in (1, 2, 6, max_rows, max_rows + 1):
        x = torch.randn(rows, 64).bfloat16()
        kernel = "gemv" if rows == 1 else "amx" if rows <= max_rows else None
        want = F.linear(x, w, b) if kernel is None else (gemv if kernel == "gemv" else amx)(x, w).add_(b)
        seen.clear()
        assert torch.equal(layer(x), want)
        assert seen == ([] if kernel is None else [(kernel, rows)])
