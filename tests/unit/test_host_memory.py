"""huge_page_buffer / huge_page_tensors: aligned, zero-filled, writable, independent."""

from __future__ import annotations

import torch

from swiftlm.backends.cpu.host_memory import HUGE_PAGE, huge_page_buffer, huge_page_tensors


def test_buffer_is_aligned_zeroed_and_writable() -> None:
    buf = huge_page_buffer(3 * HUGE_PAGE + 5)
    assert buf.dtype == torch.uint8 and buf.numel() == 3 * HUGE_PAGE + 5
    assert buf.data_ptr() % HUGE_PAGE == 0
    assert int(buf.count_nonzero()) == 0
    buf[-1] = 7
    buf[:10].fill_(1)
    assert int(buf.sum()) == 17


def test_buffer_outlives_its_mapping_object() -> None:
    view = huge_page_buffer(HUGE_PAGE)[100:200]  # only a view is kept
    view.fill_(2)
    assert int(view.sum()) == 200


def test_empty_buffer() -> None:
    assert huge_page_buffer(0).numel() == 0


def test_tensors_have_their_shapes_and_do_not_overlap() -> None:
    shapes = [(3, 5, 8), (1,), (1000, 700)]
    ts = huge_page_tensors(shapes, torch.bfloat16)
    assert [tuple(t.shape) for t in ts] == shapes
    assert all(t.dtype == torch.bfloat16 and t.is_contiguous() and t.data_ptr() % HUGE_PAGE == 0 for t in ts)
    assert all(int(t.count_nonzero()) == 0 for t in ts)
    for i, t in enumerate(ts):
        t.fill_(i + 1)
    assert [float(t.float().mean()) for t in ts] == [1.0, 2.0, 3.0]
