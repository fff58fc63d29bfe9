"""What one step's attention needs to know: where each request's queries sit and where its K/V are.

Built by the runner (``runner/inputs.py``), read by every attention backend."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    """Where each request's queries sit and where its K/V are, for one step over the paged cache."""

    query_start: list[int]  # [R + 1] row offsets into the flat batch
    seq_lens: list[int]  # [R] context length of each request after this step
    slot_mapping: torch.Tensor  # [T] int64: block_id * block_size + offset of each new token
    block_tables: torch.Tensor  # [R, max_blocks] int64, padded with the null block 0
    decode_rows: list[int]  # requests with exactly one query token (batched together)
    prefill_rows: list[int]  # requests with several query tokens
    seq_lens_tensor: torch.Tensor | None = None  # [R] int64 ``seq_lens`` on the step's device, where built already
