"""Rows padded to buckets before oneDNN: few shapes, the same results for the real rows."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from swiftlm.backends.row_buckets import bucket_rows, bucketed, row_buckets, warm_row_buckets


def test_buckets_are_few_and_cover_every_row_count() -> None:
    sizes = {bucket_rows(m) for m in range(1, 2049)}
    assert len({bucket_rows(m) for m in range(1, 513)}) <= 30
    assert all(bucket_rows(m) >= m for m in range(1, 5000))
    assert all(bucket_rows(m) - m < 8 for m in range(1, 65)) and all(bucket_rows(m) - m < 64 for m in range(65, 1025))
    assert [bucket_rows(m) for m in (1, 8, 9, 64, 65, 512, 1025)] == [1, 8, 16, 64, 128, 512, 1280]
    assert len(sizes) < 50


def test_padded_rows_give_the_real_rows_results() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 32, generator=g)
    for m in (1, 9, 63, 65, 300):
        x = torch.randn(m, 32, generator=g)
        y = bucketed(x, lambda t: F.linear(t, w))
        assert y.shape == (m, 48)
        torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-5)


class _Recording(torch.nn.Module):
    """A linear-shaped module that records the row counts it runs at."""

    def __init__(self, k: int, n: int, calls: list[tuple[int, int]]) -> None:
        super().__init__()
        self.in_features, self.out_features, self.calls = k, n, calls
        self.register_buffer("weight", torch.zeros(n, k))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append((self.in_features, x.shape[0]))
        return x @ self.weight.T


def test_warm_up_runs_each_shape_once_at_every_bucket() -> None:
    calls: list[tuple[int, int]] = []
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList(
        torch.nn.ModuleDict({"a": _Recording(32, 16, calls), "b": _Recording(16, 32, calls)}) for _ in range(3)
    )
    model.lm_head = _Recording(32, 64, calls)
    runs = warm_row_buckets(model, max_rows=100, head_rows=20, dtype=torch.float32)
    assert runs == len(calls)
    layer_rows = sorted({bucket_rows(m) for m in range(1, 101)})
    assert sorted(r for k, r in calls[:len(layer_rows)]) == layer_rows  # the first layer's `a`, every bucket
    assert [k for k, _ in calls].count(32) == len(layer_rows) + len(row_buckets(20))  # `a` once + lm_head
    assert [k for k, _ in calls].count(16) == len(layer_rows)  # `b` once, not once per layer
    assert max(r for k, r in calls[-len(row_buckets(20)):]) == bucket_rows(20)  # lm_head: only sampled rows


def test_warm_up_leaves_out_modules_that_build_no_primitives() -> None:
    # a linear whose every row count runs on swiftlm's kernels (GemvLinear with the bf16 GEMM) says so
    calls: list[tuple[int, int]] = []
    model = torch.nn.Module()
    model.a = _Recording(32, 16, calls)
    model.b = _Recording(16, 8, calls)
    model.b.builds_primitives = False
    runs = warm_row_buckets(model, max_rows=10, head_rows=4, dtype=torch.float32)
    assert runs == len(calls) == len(row_buckets(10)) and {k for k, _ in calls} == {32}
