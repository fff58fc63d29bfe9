"""The bound bf16 linear kernels are held to: float64 sums of the same bf16 values, rounded once."""

from __future__ import annotations

import torch


def check_against_float64(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """y must be the float64 result rounded to bf16, up to float32 summation error: within one
    bf16 rounding step (2^-8 relative) plus K * 2^-24 of the sum of |products|."""
    exact = x.double() @ w.double().T
    magnitude = x.double().abs() @ w.double().abs().T
    bound = exact.abs() * 2.0**-8 + magnitude * x.shape[1] * 2.0**-24 + 1e-30
    assert y.dtype == torch.bfloat16 and y.shape == exact.shape
    assert ((y.double() - exact).abs() <= bound).all()


def bad_linear_inputs() -> list[tuple[torch.Tensor, torch.Tensor, str]]:
    """(x, weight, the error's words) a bf16 linear op must refuse: K not a multiple of 32, float32,
    mismatched K, a non-contiguous x."""
    return [
        (torch.zeros(1, 48, dtype=torch.bfloat16), torch.zeros(4, 48, dtype=torch.bfloat16), "multiple of 32"),
        (torch.zeros(1, 32), torch.zeros(4, 32), "bfloat16"),
        (torch.zeros(1, 64, dtype=torch.bfloat16), torch.zeros(4, 32, dtype=torch.bfloat16), r"\[N, K\]"),
        (torch.zeros(2, 64, dtype=torch.bfloat16)[:, ::2], torch.zeros(4, 32, dtype=torch.bfloat16), "contiguous"),
    ]
