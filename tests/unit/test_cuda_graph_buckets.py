"""The decode graphs' batch-size buckets and the padding of a step to its bucket (plain Python)."""

from __future__ import annotations

import pytest

from swiftlm.backends.cuda.graph_buckets import PAD_SLOT, bucket_for, graph_batch_sizes, pad_decode_rows


def test_buckets_double_to_8_then_step_by_8_up_to_max_num_seqs() -> None:
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(3) == [1, 2, 3]
    assert graph_batch_sizes(8) == [1, 2, 4, 8]
    assert graph_batch_sizes(32) == [1, 2, 4, 8, 16, 24, 32]
    assert graph_batch_sizes(50) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 50]
    sizes = graph_batch_sizes(256)
    assert len(sizes) == 35 and sizes[-1] == 256 and sizes == sorted(set(sizes))
    with pytest.raises(ValueError, match="max_num_seqs"):
        graph_batch_sizes(0)


@pytest.mark.parametrize(("batch", "bucket"), [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16), (17, 24),
                                              (49, 50), (50, 50), (51, None), (0, None)])
def test_a_batch_replays_the_smallest_bucket_that_holds_it(batch: int, bucket: int | None) -> None:
    assert bucket_for(batch, graph_batch_sizes(50)) == bucket


def test_padding_rows_write_no_block_and_attend_no_key() -> None:
    padded = pad_decode_rows(input_ids=[11, 12, 13], positions=[5, 0, 40], slots=[21, 32, 170],
                             seq_lens=[6, 1, 41], tables=[[5, 2], [8], [3, 9, 7]], bucket=4, width=4)
    assert padded.input_ids == [11, 12, 13, 0]
    assert padded.positions == [5, 0, 40, 0]
    assert padded.slots == [21, 32, 170, PAD_SLOT]
    assert padded.seq_lens == [6, 1, 41, 0]
    assert padded.tables == [[5, 2, 0, 0], [8, 0, 0, 0], [3, 9, 7, 0], [0, 0, 0, 0]]


def test_a_step_that_does_not_fit_is_refused() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        pad_decode_rows([1, 2, 3], [0, 0, 0], [1, 2, 3], [1, 1, 1], [[1], [2], [3]], bucket=2, width=1)
    with pytest.raises(ValueError, match="captured width"):
        pad_decode_rows([1], [0], [1], [1], [[1, 2, 3]], bucket=1, width=2)
