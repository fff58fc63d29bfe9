"""The CPU token draw (``token_draw_cpu.cpp``) against the math it replaces: the argmax for greedy
rows, and for sampled rows the inverse transform over the temperature-scaled, min-p-cut
distribution, checked in float64; and in the runner, the same tokens as the torch draw."""

from __future__ import annotations

import math

import pytest
import torch

from swiftlm.backends.cpu.kernels.token_draw_cpu import load_token_draw


@pytest.fixture(scope="module")
def draw():
    op = load_token_draw()
    assert op is not None, "the token draw is plain C++ with AVX2 paths and must build wherever torch extensions do"
    return op


def _columns(rows: int, temperature: float, min_p: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((rows,), temperature), torch.full((rows,), min_p).log()


def _edges(logits: torch.Tensor, temperature: float, min_p: float) -> torch.Tensor:
    """[B, V + 1] float64: the normalised running mass before each column (and 1 at the end)."""
    y = logits.double() / temperature
    top = y.amax(dim=-1, keepdim=True)
    p = torch.exp(y - top)
    if min_p > 0:
        p = torch.where(y >= top + math.log(min_p), p, torch.zeros_like(p))
    cdf = torch.cumsum(p, dim=-1) / p.sum(dim=-1, keepdim=True)
    return torch.cat([torch.zeros(len(y), 1, dtype=torch.float64), cdf], dim=1)


@pytest.mark.parametrize("vocab", [1, 7, 64, 65, 1000, 151936])
@pytest.mark.parametrize(("temperature", "min_p"), [(0.7, 0.0), (1.3, 0.0), (1.0, 0.05)])
def test_each_draw_is_the_column_whose_mass_holds_the_uniform(draw, vocab, temperature, min_p) -> None:
    g = torch.Generator().manual_seed(vocab)
    rows = 64 if vocab < 10000 else 6
    logits = torch.randn(rows, vocab, generator=g) * 3
    uniform = torch.rand(rows, generator=g)
    uniform[0] = 0.0  # the first column with mass
    uniform[1] = 1.0 - 2**-24  # the last one
    t, lp = _columns(rows, temperature, min_p)
    ids, finite = draw(logits, t, lp, uniform)
    assert ids.dtype == torch.int64 and finite.tolist() == [True] * rows
    edges = _edges(logits, temperature, min_p)
    for r, j in enumerate(ids.tolist()):
        lo, hi = float(edges[r, j]), float(edges[r, j + 1])
        u = float(uniform[r])
        assert hi > lo, f"row {r}: column {j} has no mass"
        assert lo - 1e-5 <= u <= hi + 1e-5, f"row {r}: u={u} outside column {j}'s [{lo}, {hi}]"


def test_draws_follow_the_distribution(draw) -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0, float("-inf"), 0.5]]).repeat(20000, 1)
    temperature = 0.8
    ids, _ = draw(logits, *_columns(20000, temperature), torch.rand(20000, generator=torch.Generator().manual_seed(1)))
    counts = torch.bincount(ids, minlength=6).double() / 20000
    expected = torch.softmax(logits[0].double() / temperature, dim=-1)
    assert counts[4] == 0  # -inf is never drawn
    assert torch.allclose(counts, expected, atol=0.015), (counts, expected)


def test_min_p_cuts_the_unlikely_columns(draw) -> None:
    logits = torch.tensor([[5.0, 4.0, 0.0, 0.0, 0.0]]).repeat(4000, 1)
    ids, _ = draw(logits, *_columns(4000, 1.0, 0.2), torch.rand(4000, generator=torch.Generator().manual_seed(2)))
    assert set(ids.tolist()) == {0, 1}  # e^-5 < 0.2: the zeros are cut; e^-1 > 0.2 stays


@pytest.mark.parametrize("vocab", [1, 15, 16, 17, 4096])
def test_greedy_rows_take_the_lowest_id_of_the_largest_logit(draw, vocab) -> None:
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(vocab)).bfloat16().float()
    if vocab > 1:
        logits[1, vocab // 2] = logits[1, vocab - 1] = logits[1].max()
        logits[2] = 0.0
    ids, finite = draw(logits, torch.zeros(4), torch.full((4,), -math.inf), torch.rand(4))
    assert ids.tolist() == logits.max(dim=-1).indices.tolist()
    assert finite.tolist() == [True] * 4


def test_mixed_rows_and_non_finite_logits(draw) -> None:
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(5))
    logits[1, 17] = float("nan")
    logits[3, 250] = float("inf")
    logits[4] = float("-inf")
    temperature = torch.tensor([0.0, 0.9, 0.9, 0.0, 0.9])
    ids, finite = draw(logits, temperature, torch.full((5,), -math.inf), torch.tensor([0.0, 0.5, 0.5, 0.0, 0.5]))
    assert finite.tolist() == [True, False, True, False, False]
    assert int(ids[0]) == int(logits[0].argmax())
    assert int(ids[4]) == 0  # no mass: column 0
    assert all(0 <= i < 300 for i in ids.tolist())


def test_rejects_bad_inputs(draw) -> None:
    with pytest.raises(RuntimeError, match="float32"):
        draw(torch.zeros(2, 8, dtype=torch.bfloat16), torch.ones(2), torch.zeros(2), torch.zeros(2))
    with pytest.raises(RuntimeError, match=r"\[2\]"):
        draw(torch.zeros(2, 8), torch.ones(3), torch.zeros(2), torch.zeros(2))
