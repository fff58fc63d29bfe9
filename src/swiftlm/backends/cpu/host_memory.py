"""Host memory that a CPU streams fast: one allocation, 2 MiB aligned, on transparent huge pages.

Decode streams every weight (and, at long contexts, the KV cache) once per token, at a rate set
by the memory system. With 4 KiB pages every 4 KiB costs a TLB miss, and under a hypervisor
each miss walks two page tables. Measured on a 2-core Xeon VM (THP in ``madvise`` mode, the
common default), reading the 0.88 GB of the Qwen3-0.6B layers' weights: 53-60 ms on 4 KiB pages
against 29-32 ms on 2 MiB pages. ``huge_page_buffer`` asks for huge pages with
``madvise(MADV_HUGEPAGE)`` on an anonymous mapping; where that is unavailable (another OS, THP
off) the memory is ordinary and everything still works. Fresh anonymous memory reads as zeros,
so large zero-filled tensors need no explicit fill (pages are faulted in on first use).
"""

from __future__ import annotations

import mmap

import torch

HUGE_PAGE = 2 * 1024 * 1024


def huge_page_buffer(nbytes: int) -> torch.Tensor:
    """A zero-filled uint8 tensor of ``nbytes`` bytes starting on a 2 MiB boundary (CPU)."""
    if nbytes <= 0:
        return torch.empty(0, dtype=torch.uint8)
    size = nbytes + HUGE_PAGE  # room to move the start to a huge-page boundary
    try:
        region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (AttributeError, OSError, ValueError):  # no anonymous mmap here
        return torch.zeros(nbytes, dtype=torch.uint8)
    madvise_huge = getattr(mmap, "MADV_HUGEPAGE", None)
    if madvise_huge is not None:
        try:
            region.madvise(madvise_huge)  # before the first touch: pages are then faulted in as 2 MiB
        except OSError:
            pass
    whole = torch.frombuffer(region, dtype=torch.uint8)  # the tensor keeps the mapping alive
    start = -whole.data_ptr() % HUGE_PAGE
    return whole[start : start + nbytes]


def huge_page_tensors(shapes: list[tuple[int, ...]], dtype: torch.dtype) -> list[torch.Tensor]:
    """Zero-filled tensors of ``shapes`` in one huge-page buffer, each starting on a 2 MiB boundary."""
    sizes = [torch.Size(s).numel() * dtype.itemsize for s in shapes]
    padded = [-(-n // HUGE_PAGE) * HUGE_PAGE for n in sizes]
    buf = huge_page_buffer(sum(padded))
    out, offset = [], 0
    for shape, n, step in zip(shapes, sizes, padded, strict=True):
        out.append(buf[offset : offset + n].view(dtype).view(shape))
        offset += step
    return out
