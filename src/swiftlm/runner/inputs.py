"""Flat varlen inputs for one step, built in one place from the scheduler's decisions.

The step's tokens are the scheduled chunks of all requests, concatenated:

    request:      |----- r0: 5 new (prefill chunk) -----|- r1: 1 (decode) -|- r2: 3 -|
    flat row:      0  1  2  3  4                          5                  6  7  8
    positions:     c0 .. c0+4                             c1                 c2 .. c2+2
    query_start:  [0, 5, 6, 9]      seq_lens: [c0+5, c1+1, c2+3]      (c = tokens computed before)

A token at position p of request r goes to slot ``block_ids[p // block_size] * block_size +
p % block_size`` of the paged pools. Only requests that sample get a logits row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from swiftlm.core.schedule import ScheduledRequest
from swiftlm.core.step import AttentionMetadata


@dataclass(frozen=True, slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    attention: AttentionMetadata
    logits_indices: torch.Tensor  # [S] flat rows whose logits are sampled (last row of a request)
    sampling_requests: list[int]  # [S] index into the scheduled list of each sampling request


def build_step_inputs(scheduled: Sequence[ScheduledRequest], block_size: int, device: str = "cpu") -> StepInputs:
    # plain Python lists, one tensor each at the end: a decode step has a handful of rows, and
    # ~10 small torch ops cost more than the lists (~0.6 ms a step)
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    seq_lens: list[int] = []
    logits_rows: list[int] = []
    sampling: list[int] = []
    decode_rows: list[int] = []
    prefill_rows: list[int] = []
    tables: list[list[int]] = []
    for i, s in enumerate(scheduled):
        r, n = s.request, s.num_new_tokens
        c = r.num_computed_tokens
        blocks = r.block_ids
        ids.extend(r.all_token_ids[c : c + n])
        positions.extend(range(c, c + n))
        slots.extend(blocks[p // block_size] * block_size + p % block_size for p in range(c, c + n))
        query_start.append(query_start[-1] + n)
        seq_lens.append(c + n)
        (decode_rows if n == 1 else prefill_rows).append(i)
        tables.append(blocks)
        if s.samples:
            logits_rows.append(query_start[-1] - 1)
            sampling.append(i)
    max_blocks = max((len(b) for b in tables), default=1) or 1
    padded = [list(b) + [0] * (max_blocks - len(b)) for b in tables]  # padded with the null block 0
    block_tables = torch.tensor(padded, dtype=torch.int64).view(len(tables), max_blocks)
    meta = AttentionMetadata(
        query_start=query_start,
        seq_lens=seq_lens,
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_tables=block_tables.to(device),
        decode_rows=decode_rows,
        prefill_rows=prefill_rows,
    )
    return StepInputs(
        input_ids=torch.tensor(ids, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        attention=meta,
        logits_indices=torch.tensor(logits_rows, dtype=torch.int64, device=device),
        sampling_requests=sampling,
    )
