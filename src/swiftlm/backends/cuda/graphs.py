"""CUDA graphs for decode-only steps: captured once at start, one per batch-size bucket.

A decode step of ``B`` sequences replays the graph of the smallest bucket ``>= B`` (buckets 1, 2,
4, 8, then every 8 up to ``max_num_seqs``). The graph reads static buffers sized for the largest
bucket; a step copies its inputs into their first ``B`` rows and pads rows ``B .. bucket - 1``:

    row:        0 .. B-1 (the step's sequences)  | B .. bucket-1 (padding)
    input id:   the step's tokens                | 0
    position:   the step's positions             | 0
    slot:       the step's slots                 | -1  (the KV store skips it: no block is written)
    seq_len:    the step's lengths               | 0   (attends no key; its output row is discarded)
    table:      the step's block tables          | 0   (the null block, never read)

The bucket choice and the padding are plain Python (``graph_buckets.py``: ``graph_batch_sizes``,
``bucket_for``, ``pad_decode_rows``), tested on CPU; ``DecodeGraphs`` captures and replays on a
CUDA device.
``--enforce-eager`` captures nothing."""

from __future__ import annotations

from collections.abc import Callable

import torch

from swiftlm.backends.cuda.attention import GraphDecodeAttention
from swiftlm.backends.cuda.graph_buckets import PAD_ROW, bucket_for
from swiftlm.backends.kv_cache import KVCache
from swiftlm.core.step import AttentionMetadata

# (input_ids [B], positions [B], attention) -> hidden [B, hidden]: the model's forward
Forward = Callable[[torch.Tensor, torch.Tensor, GraphDecodeAttention], torch.Tensor]


class DecodeGraphs:
    """The captured decode graphs of one model over one KV cache (CUDA only)."""

    def __init__(self, forward: Forward, kv_cache: KVCache, sizes: list[int], max_blocks: int,
                 device: torch.device) -> None:
        self.sizes = sizes
        self.max_blocks = max_blocks  # block-table width of every graph: max_model_len / block_size
        n = sizes[-1]
        i64 = dict(dtype=torch.int64, device=device)
        pad = PAD_ROW
        self.input_ids = torch.full((n,), pad.input_id, **i64)
        self.positions = torch.full((n,), pad.position, **i64)
        self.slots = torch.full((n,), pad.slot, **i64)
        self.seq_lens = torch.full((n,), pad.seq_len, dtype=torch.int32, device=device)
        self.tables = torch.full((n, max_blocks), pad.block, **i64)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        pool = None
        for size in reversed(sizes):  # largest first: the smaller graphs reuse its memory pool
            attn = GraphDecodeAttention(kv_cache, self.slots[:size], self.tables[:size], self.seq_lens[:size])
            forward(self.input_ids[:size], self.positions[:size], attn)  # warm-up: kernels compiled outside capture
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._outputs[size] = forward(self.input_ids[:size], self.positions[:size], attn)
            pool = graph.pool()
            self._graphs[size] = graph
        torch.cuda.synchronize(device)

    def bucket(self, batch: int, meta: AttentionMetadata) -> int | None:
        """The bucket a decode-only step of ``batch`` rows replays, or None (run it eagerly)."""
        if meta.prefill_rows or meta.block_tables.shape[1] > self.max_blocks:
            return None
        return bucket_for(batch, self.sizes)

    def replay(self, bucket: int, input_ids: torch.Tensor, positions: torch.Tensor,
               meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states [B, hidden] of the step's ``B`` rows: inputs copied into the static
        buffers (device to device), padding rows reset, the bucket's graph replayed."""
        b, width, pad = input_ids.shape[0], meta.block_tables.shape[1], PAD_ROW
        self.input_ids[b:bucket].fill_(pad.input_id)
        self.positions[b:bucket].fill_(pad.position)
        self.slots[b:bucket].fill_(pad.slot)
        self.tables[:bucket].fill_(pad.block)
        self.input_ids[:b].copy_(input_ids, non_blocking=True)
        self.positions[:b].copy_(positions, non_blocking=True)
        self.slots[:b].copy_(meta.slot_mapping, non_blocking=True)
        lens = meta.seq_lens + [pad.seq_len] * (bucket - b)  # [bucket] host list: one pinned copy
        self.seq_lens[:bucket].copy_(torch.tensor(lens, dtype=torch.int32).pin_memory(), non_blocking=True)
        self.tables[:b, :width].copy_(meta.block_tables, non_blocking=True)
        self._graphs[bucket].replay()
        return self._outputs[bucket][:b]
