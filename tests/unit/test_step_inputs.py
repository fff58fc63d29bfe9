"""build_step_inputs: the flat varlen layout of one step (the module docstring's example)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from swiftlm.runner.inputs import build_step_inputs

BS = 4  # block size


def scheduled(
    computed: int, new: int, blocks: list[int], samples: bool = True, drafts: tuple[int, ...] = ()
) -> SimpleNamespace:
    tokens = list(range(100 * len(blocks), 100 * len(blocks) + computed + new))
    request = SimpleNamespace(num_computed_tokens=computed, all_token_ids=tokens, block_ids=blocks, prompt_logprobs=None)
    return SimpleNamespace(request=request, num_new_tokens=new, samples=samples, draft_token_ids=drafts)


def scoring(computed: int, new: int, prompt: list[int], scored: int, top_k: int = 1) -> SimpleNamespace:
    """A request with prompt_logprobs: ``scored`` prompt entries already held (the first is None)."""
    s = scheduled(computed, new, [1, 2, 3, 4])
    r = s.request
    r.all_token_ids, r.prompt_token_ids, r.num_prompt_tokens = list(prompt), list(prompt), len(prompt)
    r.prompt_logprobs = [None] + [{}] * (scored - 1)
    r.sampling_params = SimpleNamespace(prompt_logprobs=top_k)
    s.samples = computed + new == len(prompt)
    return s


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


def test_requests_without_prompt_logprobs_get_no_prompt_rows() -> None:
    steps = [scheduled(2, 5, [7, 3], samples=False), scheduled(9, 1, [1, 2, 5]), scheduled(0, 3, [6])]
    assert build_step_inputs(steps, BS).prompt_rows == []


def test_prompt_rows_across_chunks() -> None:
    prompt = [50 + i for i in range(7)]
    # chunk 1 (positions 0..3) beside a decode row: rows 0..3 score prompt tokens 1..4
    first = build_step_inputs([scheduled(9, 1, [1, 2, 5]), scoring(0, 4, prompt, scored=1, top_k=3)], BS)
    (rows,) = first.prompt_rows
    assert (rows.request, rows.start, rows.targets, rows.top_k) == (1, 1, prompt[1:5], 3)
    assert first.sampling_requests == [0]
    # chunk 2 (positions 4..6): rows at 4 and 5 score tokens 5 and 6; the last row samples
    second = build_step_inputs([scoring(4, 3, prompt, scored=5)], BS)
    (rows,) = second.prompt_rows
    assert (rows.start, rows.targets) == (0, prompt[5:7])
    assert second.logits_indices.tolist() == [2]


def test_recompute_after_preemption_skips_scored_tokens() -> None:
    prompt = [50 + i for i in range(7)]
    again = build_step_inputs([scoring(0, 7, prompt, scored=5)], BS)  # tokens 1..4 already scored
    (rows,) = again.prompt_rows
    assert (rows.start, rows.targets) == (4, prompt[5:7])
    done = build_step_inputs([scoring(0, 7, prompt, scored=7)], BS)
    assert done.prompt_rows == []


def test_draft_tokens_follow_the_last_token_and_every_row_of_them_samples() -> None:
    # r0 decodes with 3 drafts (a 4-row chunk over its cached context), r1 decodes plainly
    steps = [scheduled(6, 1, [1, 2, 3], drafts=(71, 72, 73)), scheduled(9, 1, [4, 5, 6])]
    got = build_step_inputs(steps, BS)
    assert got.input_ids.tolist() == [steps[0].request.all_token_ids[6], 71, 72, 73, steps[1].request.all_token_ids[9]]
    assert got.positions.tolist() == [6, 7, 8, 9, 9]
    meta = got.attention
    assert meta.query_start == [0, 4, 5] and meta.seq_lens == [10, 10]
    assert meta.slot_mapping.tolist() == [2 * BS + 2, 2 * BS + 3, 3 * BS + 0, 3 * BS + 1, 6 * BS + 1]
    assert meta.decode_rows == [1] and meta.prefill_rows == [0]
    assert got.logits_indices.tolist() == [0, 1, 2, 3, 4] and got.sampling_requests == [0, 0, 0, 0, 1]
