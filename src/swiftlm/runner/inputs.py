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

from swiftlm.engine.scheduler import ScheduledRequest
from swiftlm.runner.attention import AttentionMetadata


@dataclass(frozen=True, slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    attention: AttentionMetadata
    logits_indices: torch.Tensor  # [S] flat rows whose logits are sampled (last row of a request)
    sampling_requests: list[int]  # [S] index into the scheduled list of each sampling request


def build_step_inputs(scheduled: Sequence[ScheduledRequest], block_size: int, device: str = "cpu") -> StepInputs:
    ids: list[int] = []
    starts: list[int] = []  # first position computed, per request
    query_start = [0]
    seq_lens: list[int] = []
    logits_rows: list[int] = []
    sampling: list[int] = []
    decode_rows: list[int] = []
    prefill_rows: list[int] = []
    max_blocks = 1
    for i, s in enumerate(scheduled):
        r, n = s.request, s.num_new_tokens
        c = r.num_computed_tokens
        ids.extend(r.all_token_ids[c : c + n])
        starts.append(c)
        query_start.append(query_start[-1] + n)
        seq_lens.append(c + n)
        (decode_rows if n == 1 else prefill_rows).append(i)
        max_blocks = max(max_blocks, len(r.block_ids))
        if s.samples:
            logits_rows.append(query_start[-1] - 1)
            sampling.append(i)
    num_reqs = len(scheduled)
    block_tables = torch.zeros((num_reqs, max_blocks), dtype=torch.int64)  # padded with the null block
    for i, s in enumerate(scheduled):
        b = s.request.block_ids
        block_tables[i, : len(b)] = torch.tensor(b, dtype=torch.int64)
    lens = torch.tensor([query_start[i + 1] - query_start[i] for i in range(num_reqs)])
    request_of_row = torch.repeat_interleave(torch.arange(num_reqs), lens)  # [T]
    # positions: each request's rows count up from its first computed position
    row = torch.arange(query_start[-1])
    positions = row - torch.tensor(query_start[:-1])[request_of_row] + torch.tensor(starts)[request_of_row]
    slot_mapping = block_tables[request_of_row, positions // block_size] * block_size + positions % block_size
    meta = AttentionMetadata(
        query_start=query_start,
        seq_lens=seq_lens,
        slot_mapping=slot_mapping.to(device),
        block_tables=block_tables.to(device),
        decode_rows=decode_rows,
        prefill_rows=prefill_rows,
    )
    return StepInputs(
        input_ids=torch.tensor(ids, dtype=torch.int64, device=device),
        positions=positions.to(device),
        attention=meta,
        logits_indices=torch.tensor(logits_rows, dtype=torch.int64, device=device),
        sampling_requests=sampling,
    )
