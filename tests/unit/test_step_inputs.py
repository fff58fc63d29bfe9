"""build_step_inputs: the flat varlen layout of one step (the module docstring's example)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from swiftlm.runner.inputs import build_step_inputs

BS = 4  # block size


def scheduled(computed: int, new: int, blocks: list[int], samples: bool = True) -> SimpleNamespace:
    tokens = list(range(100 * len(blocks), 100 * len(blocks) + computed + new))
    request = SimpleNamespace(num_computed_tokens=computed, all_token_ids=tokens, block_ids=blocks)
    return SimpleNamespace(request=request, num_new_tokens=new, samples=samples)


def test_prefill_chunk_decode_and_partial_chunk() -> None:
    steps = [scheduled(2, 5, [7, 3], samples=False), scheduled(9, 1, [1, 2, 5]), scheduled(0, 3, [6])]
    got = build_step_inputs(steps, BS)
    assert got.input_ids.tolist() == [*steps[0].request.all_token_ids[2:7], steps[1].request.all_token_ids[9],
                                      *steps[2].request.all_token_ids[:3]]
    assert got.positions.tolist() == [2, 3, 4, 5, 6, 9, 0, 1, 2]
    meta = got.attention
    assert meta.query_start == [0, 5, 6, 9] and meta.seq_lens == [7, 10, 3]
    # token at position p of a request sits in slot block_ids[p // BS] * BS + p % BS
    want_slots = []
    for s in steps:
        c, n, blocks = s.request.num_computed_tokens, s.num_new_tokens, s.request.block_ids
        want_slots += [blocks[p // BS] * BS + p % BS for p in range(c, c + n)]
    assert meta.slot_mapping.tolist() == want_slots
    assert meta.block_tables.tolist() == [[7, 3, 0], [1, 2, 5], [6, 0, 0]]
    assert meta.block_tables.dtype == meta.slot_mapping.dtype == torch.int64
    assert meta.decode_rows == [1] and meta.prefill_rows == [0, 2]
    assert got.logits_indices.tolist() == [5, 8] and got.sampling_requests == [1, 2]


def test_single_decode_row() -> None:
    got = build_step_inputs([scheduled(4, 1, [2, 9])], BS)
    assert got.positions.tolist() == [4] and got.attention.slot_mapping.tolist() == [9 * BS]
    assert got.attention.block_tables.shape == (1, 2)
