"""Rows padded to buckets before oneDNN: few shapes, the same results for the real rows."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from swiftlm.backends.row_buckets import bucket_rows, bucketed


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
