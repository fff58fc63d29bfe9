"""Decode steps built from the block tables kept between steps (``DecodeTables``) equal the same
steps built from each request's block list, as the requests grow, gain blocks, are replaced, wait
on a launched step's token, and outnumber the table's rows."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from swiftlm.runner.block_tables import DecodeTables
from swiftlm.runner.inputs import build_step_inputs

BS = 4


def request(rng: random.Random, pool: list[int]) -> SimpleNamespace:
    prompt = [rng.randrange(1000) for _ in range(rng.randrange(1, 13))]
    c = len(prompt) - 1  # its prompt computed but for the last token: the next step decodes it
    blocks = [pool.pop() for _ in range(c // BS + 1)]
    return SimpleNamespace(all_token_ids=prompt, num_computed_tokens=c, block_ids=blocks, prompt_logprobs=None,
                           num_pending=0, sampling_params=SimpleNamespace(max_tokens=None))


def decode(r: SimpleNamespace) -> SimpleNamespace:
    return SimpleNamespace(request=r, num_new_tokens=1, draft_token_ids=(), samples=True)


def same(a, b) -> None:
    for name in ("input_ids", "positions", "logits_indices"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    ma, mb = a.attention, b.attention
    assert ma.query_start == mb.query_start and ma.seq_lens == mb.seq_lens
    assert ma.decode_rows == mb.decode_rows and ma.prefill_rows == mb.prefill_rows
    assert torch.equal(ma.slot_mapping, mb.slot_mapping)
    # the kept table may be narrower (blocks the contexts span) than the lists' longest: compare that span
    width = ma.block_tables.shape[1]
    assert width >= -(-max(ma.seq_lens) // BS)
    assert torch.equal(ma.block_tables, mb.block_tables[:, :width])
    assert a.sampling_requests == b.sampling_requests
    assert a.previous_rows == b.previous_rows and a.previous_index == b.previous_index


@pytest.mark.parametrize("capacity", [4, 64])
def test_kept_tables_equal_the_lists_step_after_step(capacity: int) -> None:
    rng = random.Random(capacity)
    pool = list(range(1, 10_000))
    rng.shuffle(pool)
    tables = DecodeTables(capacity, 64)
    live = [request(rng, pool) for _ in range(6)]
    for _ in range(120):
        batch = rng.sample(live, rng.randrange(1, min(len(live), capacity) + 1))
        previous = {}
        for j, r in enumerate(batch):
            if rng.random() < 0.3 and r.num_computed_tokens == len(r.all_token_ids) - 1:
                r.all_token_ids.pop()  # its input token is a launched step's, not on the host yet
                r.num_pending = 1
                previous[id(r)] = j
        steps = [decode(r) for r in batch]
        fast = build_step_inputs(steps, BS, previous=previous or None, tables=tables)
        plain = build_step_inputs(steps, BS, previous=previous or None)
        assert fast.attention.block_tables.shape[1] <= plain.attention.block_tables.shape[1]
        same(fast, plain)
        for r in batch:  # the step lands: its token is appended, the request moves on a position
            if r.num_pending:  # the launched step's token lands too
                r.num_pending = 0
                r.all_token_ids.append(rng.randrange(1000))
            r.all_token_ids.append(rng.randrange(1000))
            r.num_computed_tokens += 1
            c = r.num_computed_tokens
            if c // BS + 1 > len(r.block_ids):
                r.block_ids.extend([pool.pop()])  # grown in place, as allocate_slots does
        if rng.random() < 0.2:  # preempted and readmitted: another list object, other blocks
            r = rng.choice(live)
            r.block_ids = [pool.pop() for _ in r.block_ids]
        if rng.random() < 0.2:  # one leaves, another arrives
            live.remove(rng.choice(live))
            live.append(request(rng, pool))


def test_other_steps_take_the_general_path() -> None:
    rng = random.Random(0)
    pool = list(range(1, 100))
    tables = DecodeTables(8, 16)
    r = request(rng, pool)
    r.num_computed_tokens = 0  # a prefill chunk of the whole prompt
    chunk = SimpleNamespace(request=r, num_new_tokens=len(r.all_token_ids), draft_token_ids=(), samples=True)
    same(build_step_inputs([chunk], BS, tables=tables), build_step_inputs([chunk], BS))
    assert build_step_inputs([chunk], BS, tables=tables).attention.prefill_rows == [0]


def test_a_request_wider_than_a_row_is_built_from_its_list() -> None:
    rng = random.Random(1)
    pool = list(range(1, 100))
    tables = DecodeTables(8, 2)  # rows of two blocks
    r = request(rng, pool)
    r.all_token_ids = list(range(20))
    r.num_computed_tokens = 19
    r.block_ids = [pool.pop() for _ in range(5)]
    same(build_step_inputs([decode(r)], BS, tables=tables), build_step_inputs([decode(r)], BS))
