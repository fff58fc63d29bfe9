"""Flat varlen inputs for one step, built in one place from the scheduler's decisions.

The step's tokens are the scheduled chunks of all requests, concatenated:

    request:      |----- r0: 5 new (prefill chunk) -----|- r1: 1 (decode) -|- r2: 3 -|
    flat row:      0  1  2  3  4                          5                  6  7  8
    positions:     c0 .. c0+4                             c1                 c2 .. c2+2
    query_start:  [0, 5, 6, 9]      seq_lens: [c0+5, c1+1, c2+3]      (c = tokens computed before)

A token at position p of request r goes to slot ``block_ids[p // block_size] * block_size +
p % block_size`` of the paged pools. Only requests that sample get a logits row (a request with
k draft tokens after its last token gets k + 1: one per position it verifies), and the lead
sequence of a request with ``prompt_logprobs`` gets one more for each prompt row whose successor
still needs scoring (``PromptRows``). The row at position q predicts the token at q + 1, so a
chunk's last row scores the next chunk's first token:

    prompt:        t0 t1 t2 t3 t4 t5 t6        (P = 7; t0 has no logprob)
    chunk 1:       t0 t1 t2 t3                 rows at q = 0..3 score t1..t4
    chunk 2:                   t4 t5 t6        rows at q = 4, 5 score t5, t6; q = 6 samples

Overlapped steps: a decoding request's input token may be one the step before is still sampling
(``Request.num_pending``). Its row gets a placeholder id, and ``previous_rows`` / ``previous_index``
say where the runner takes the real id from: the previous step's sampled row ``previous_index[j]``
goes to flat row ``previous_rows[j]``, on the device, before the forward.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from swiftlm.core.schedule import ScheduledRequest
from swiftlm.core.step import AttentionMetadata
from swiftlm.runner.block_tables import DecodeTables


@dataclass(frozen=True, slots=True)
class PromptRows:
    """Consecutive flat rows of one request whose logits score the prompt tokens after them."""

    request: int  # index into the scheduled list
    start: int  # first flat row
    targets: list[int]  # the prompt tokens those rows predict, one per row
    top_k: int  # how many most likely tokens to report besides the target


@dataclass(frozen=True, slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    attention: AttentionMetadata
    # [S] flat rows whose logits are sampled: a request's last row, or its last k + 1 with k drafts
    logits_indices: torch.Tensor
    sampling_requests: list[int]  # [S] index into the scheduled list of each sampled row's request
    prompt_rows: list[PromptRows] = field(default_factory=list)  # empty unless a request asks
    # overlapped steps: flat rows whose token the previous step samples, and which of its sampled rows
    previous_rows: list[int] = field(default_factory=list)
    previous_index: list[int] = field(default_factory=list)


def build_step_inputs(
    scheduled: Sequence[ScheduledRequest], block_size: int, device: str = "cpu",
    previous: Mapping[int, int] | None = None, tables: DecodeTables | None = None,
) -> StepInputs:
    """``previous``: id(request) -> its sampled row in the launched step before this one, for the
    requests whose next input token that step is sampling (overlapped steps; None: serial).
    ``tables``: the block tables kept between steps; a step of plain decodes alone (one token, no
    drafts, no prompt logprobs: most steps) is then built in array operations (``_decode_inputs``)."""
    if tables is not None and scheduled:
        inputs = _decode_inputs(scheduled, block_size, device, previous, tables)
        if inputs is not None:
            return inputs
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
    prompt_rows: list[PromptRows] = []
    previous_rows: list[int] = []
    previous_index: list[int] = []
    for i, s in enumerate(scheduled):
        r, n = s.request, s.num_new_tokens
        c = r.num_computed_tokens
        k = len(s.draft_token_ids)  # draft tokens after the real ones, at positions c + n .. c + n + k - 1
        blocks = r.block_ids
        if n == 1 and not k and r.prompt_logprobs is None:  # one row at position c: a decode, most rows
            known = r.all_token_ids
            if c < len(known):
                ids.append(known[c])
            else:  # the launched step before this one samples it
                assert previous is not None and c == len(known), "one pending token, the last"
                previous_rows.append(len(ids))
                previous_index.append(previous[id(r)])
                ids.append(0)
            positions.append(c)
            slots.append(blocks[c // block_size] * block_size + c % block_size)
            row = query_start[-1]
            query_start.append(row + 1)
            seq_lens.append(c + 1)
            decode_rows.append(i)
            tables.append(blocks)
            if s.samples:
                logits_rows.append(row)
                sampling.append(i)
            continue
        ids.extend(r.all_token_ids[c : c + n])
        if c + n > len(r.all_token_ids):  # its token at len(all_token_ids): the launched step samples it
            assert previous is not None and c + n == len(r.all_token_ids) + 1, "one pending token, the last"
            previous_rows.append(len(ids))
            previous_index.append(previous[id(r)])
            ids.append(0)
        ids.extend(s.draft_token_ids)
        positions.extend(range(c, c + n + k))
        if n + k <= _SLOTS_BY_LOOP:
            slots.extend(blocks[p // block_size] * block_size + p % block_size for p in range(c, c + n + k))
        else:  # a long chunk: the slots of positions c .. c + n + k - 1 in one array expression
            pos = np.arange(c, c + n + k)
            slots.extend((np.asarray(blocks)[pos // block_size] * block_size + pos % block_size).tolist())
        query_start.append(query_start[-1] + n + k)
        seq_lens.append(c + n + k)
        (decode_rows if n + k == 1 else prefill_rows).append(i)
        tables.append(blocks)
        if s.samples:
            # the last real token's row, then each draft's: k + 1 consecutive rows, in position order
            logits_rows.extend(range(query_start[-1] - k - 1, query_start[-1]))
            sampling.extend([i] * (k + 1))
        if r.prompt_logprobs is not None:
            # rows at positions [q0, q1) score prompt tokens q0 + 1 .. q1 not scored yet (after a
            # preemption the recompute skips those it already has)
            q0 = max(c, len(r.prompt_logprobs) - 1)
            q1 = min(c + n, r.num_prompt_tokens - 1)
            if q0 < q1:
                start = query_start[-2] + q0 - c
                targets = r.prompt_token_ids[q0 + 1 : q1 + 1]
                prompt_rows.append(PromptRows(i, start, targets, r.sampling_params.prompt_logprobs or 0))
    block_tables = torch.from_numpy(_padded_tables(tables))
    meta = AttentionMetadata(
        query_start=query_start,
        seq_lens=seq_lens,
        slot_mapping=_on(device, host_int64(slots)),
        block_tables=_on(device, block_tables),
        decode_rows=decode_rows,
        prefill_rows=prefill_rows,
    )
    return StepInputs(
        input_ids=_on(device, host_int64(ids)),
        positions=_on(device, host_int64(positions)),
        attention=meta,
        logits_indices=_on(device, host_int64(logits_rows)),
        sampling_requests=sampling,
        prompt_rows=prompt_rows,
        previous_rows=previous_rows,
        previous_index=previous_index,
    )


def _decode_inputs(
    scheduled: Sequence[ScheduledRequest], block_size: int, device: str,
    previous: Mapping[int, int] | None, tables: DecodeTables,
) -> StepInputs | None:
    """``build_step_inputs`` for a step of plain decodes alone, or None for any other step. Row i is
    request i at position c_i = its computed tokens: slot = table[i, c_i // block_size] *
    block_size + c_i % block_size, context c_i + 1; every row samples."""
    requests = []
    ids: list[int] = []
    positions: list[int] = []
    previous_rows: list[int] = []
    previous_index: list[int] = []
    for i, s in enumerate(scheduled):
        r = s.request
        known, c = r.all_token_ids, r.num_computed_tokens
        # a decode that samples (``ScheduledRequest.samples``), without drafts or prompt scoring
        if (s.num_new_tokens != 1 or s.draft_token_ids or r.prompt_logprobs is not None
                or c + 1 != len(known) + r.num_pending or r.sampling_params.max_tokens == 0):
            return None
        if c < len(known):
            ids.append(known[c])
        else:  # the launched step before this one samples it
            assert previous is not None and c == len(known), "one pending token, the last"
            previous_rows.append(i)
            previous_index.append(previous[id(r)])
            ids.append(0)
        positions.append(c)
        requests.append(r)
    rows = tables.rows(requests)
    if rows is None:
        return None
    n = len(requests)
    computed = np.array(positions, dtype=np.int64)  # [n] positions
    seq_lens = computed + 1
    width = int((seq_lens.max() + block_size - 1) // block_size)  # blocks the longest context spans
    block_tables = tables.table[rows, :width]  # [n, width]: a copy, the step's own
    slots = block_tables[np.arange(n), computed // block_size] * block_size + computed % block_size
    meta = AttentionMetadata(
        query_start=list(range(n + 1)),
        seq_lens=seq_lens.tolist(),
        slot_mapping=_on(device, torch.from_numpy(slots)),
        block_tables=_on(device, torch.from_numpy(block_tables)),
        decode_rows=list(range(n)),
        prefill_rows=[],
        seq_lens_tensor=_on(device, torch.from_numpy(seq_lens)),
    )
    return StepInputs(
        input_ids=_on(device, host_int64(ids)),
        positions=_on(device, torch.from_numpy(computed)),
        attention=meta,
        logits_indices=_on(device, torch.arange(n, dtype=torch.int64)),
        sampling_requests=list(range(n)),
        previous_rows=previous_rows,
        previous_index=previous_index,
    )


_SLOTS_BY_LOOP = 64  # chunks up to this many rows compute their slots in a Python loop


def _padded_tables(tables: list[list[int]]) -> np.ndarray:
    """[R, max blocks] int64, each row padded with the null block 0. Row by row into one array:
    for 256 tables of up to 128 blocks ~0.6 ms, where ``torch.tensor`` of padded lists took ~3 ms."""
    max_blocks = max((len(b) for b in tables), default=1) or 1
    out = np.zeros((len(tables), max_blocks), dtype=np.int64)
    for i, blocks in enumerate(tables):
        out[i, : len(blocks)] = blocks
    return out


def host_int64(values: Sequence[int]) -> torch.Tensor:
    """[N] int64 host tensor of Python ints: through numpy, ~5x faster than ``torch.tensor`` of a list
    (for 256 ints ~11 µs against ~55 µs on a Zen3 VM)."""
    return torch.from_numpy(np.array(values, dtype=np.int64))


def _on(device: str, host: torch.Tensor) -> torch.Tensor:
    """A host tensor on ``device``: on CUDA through pinned memory, copied without waiting (the copy
    is ordered on the stream before the step's kernels read it); elsewhere as it is."""
    if not device.startswith("cuda"):
        return host if device == "cpu" else host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
