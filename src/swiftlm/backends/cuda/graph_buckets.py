"""The batch-size buckets of the decode graphs and the padding of a step to its bucket: plain
Python (no torch, no triton), tested on CPU. See ``graphs.py`` for the layout of a padded step."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

PAD_SLOT = -1  # a padded row's slot: the KV store writes nothing for it


@dataclass(frozen=True, slots=True)
class PadRow:
    """What a padding row holds in each static buffer of a graph."""

    input_id: int = 0
    position: int = 0
    slot: int = PAD_SLOT  # stores nothing
    seq_len: int = 0  # attends no key: its output row is zeros, and discarded
    block: int = 0  # the null block, in every column of its table (never read)


PAD_ROW = PadRow()


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """The captured batch sizes: 1, 2, 4, 8, 16, 24, 32, ... the last one ``max_num_seqs``."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs]
    sizes += range(8, max_num_seqs, 8)
    return [*sizes, max_num_seqs]


def bucket_for(batch: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds ``batch`` rows; None when none does (run eagerly)."""
    if batch < 1:
        return None
    i = bisect.bisect_left(sizes, batch)
    return sizes[i] if i < len(sizes) else None


@dataclass(frozen=True, slots=True)
class PaddedDecodeRows:
    """One decode step's inputs padded to its bucket, as host lists (row order as the step's)."""

    input_ids: list[int]  # [bucket]
    positions: list[int]  # [bucket]
    slots: list[int]  # [bucket]
    seq_lens: list[int]  # [bucket]
    tables: list[list[int]]  # [bucket, width]


def pad_decode_rows(
    input_ids: list[int], positions: list[int], slots: list[int], seq_lens: list[int], tables: list[list[int]],
    bucket: int, width: int,
) -> PaddedDecodeRows:
    """The step's ``B`` rows, then ``bucket - B`` rows of ``PAD_ROW``; every table padded to
    ``width`` blocks with the null block 0. ``DecodeGraphs.replay`` pads its device buffers the
    same way (the same ``PAD_ROW``), without building these lists."""
    b = len(input_ids)
    if not b <= bucket:
        raise ValueError(f"{b} decode rows do not fit a bucket of {bucket}")
    if any(len(t) > width for t in tables):
        raise ValueError(f"a block table is longer than the captured width of {width} blocks")
    pad, row = bucket - b, PAD_ROW
    return PaddedDecodeRows(
        input_ids=[*input_ids, *[row.input_id] * pad],
        positions=[*positions, *[row.position] * pad],
        slots=[*slots, *[row.slot] * pad],
        seq_lens=[*seq_lens, *[row.seq_len] * pad],
        tables=[[*t, *[row.block] * (width - len(t))] for t in tables] + [[row.block] * width for _ in range(pad)],
    )
