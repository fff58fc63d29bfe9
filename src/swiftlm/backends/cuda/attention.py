"""Attention over the paged pools through the Triton kernels (``kernels/``).

``TritonPagedAttention.bind(meta)`` returns the step's ``Attention`` callable: per layer it stores
the new K/V (``store_kv``) and attends, a decode-only step through ``decode_attention`` (GQA in
one tile), any other step (prefill chunks, prefix hits, decode rows beside them: a decode row is a
chunk of one) through ``prefill_attention``. The step's lengths go to the device once per step,
not per layer. ``GraphDecodeAttention`` is the same decode path over the static buffers of a
captured CUDA graph (``graphs.py``)."""

from __future__ import annotations

import torch

from swiftlm.backends.cuda.host_copy import to_device
from swiftlm.backends.cuda.kernels.decode_attention import decode_attention
from swiftlm.backends.cuda.kernels.prefill_attention import prefill_attention
from swiftlm.backends.cuda.kernels.store_kv import store_kv
from swiftlm.backends.kv_cache import KVCache
from swiftlm.core.step import AttentionMetadata


class TritonPagedAttention:
    """The Triton path over ``kv_cache`` (unquantised pools only: a quantised cache uses the
    reference ``PagedAttention``, see ``CudaBackend.attention``)."""

    def __init__(self, kv_cache: KVCache) -> None:
        if kv_cache.fmt is not None:
            raise ValueError("the Triton attention reads unquantised pools; use PagedAttention for a quantised cache")
        self.kv_cache = kv_cache

    def bind(self, meta: AttentionMetadata) -> BoundTritonAttention:
        return BoundTritonAttention(self.kv_cache, meta)


class BoundTritonAttention:
    """One step's attention callable: ``(layer, q [T, Hq, D], k, v [T, Hkv, D]) -> [T, Hq, D]``."""

    __slots__ = ("kv_cache", "meta", "slots", "tables", "seq_lens", "query_start", "max_query_len", "decode_only")

    def __init__(self, kv_cache: KVCache, meta: AttentionMetadata) -> None:
        self.kv_cache, self.meta = kv_cache, meta
        self.slots = meta.slot_mapping
        device = meta.slot_mapping.device
        self.seq_lens = to_device(meta.seq_lens, device)  # [R]
        bs = kv_cache.block_size
        max_blocks = (max(meta.seq_lens, default=1) + bs - 1) // bs
        self.tables = meta.block_tables[:, :max_blocks]  # [R, max_blocks]: the columns any key needs
        self.decode_only = None  # the fused whole-layer ops of the CPU backend do not run here
        qs = meta.query_start
        self.max_query_len = max((qs[i + 1] - qs[i] for i in range(len(qs) - 1)), default=0)
        # [R + 1] row offsets; None for a decode-only step (one row per request, in order)
        self.query_start = to_device(qs, device) if meta.prefill_rows else None

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_pool, v_pool = self.kv_cache.layer(layer)
        store_kv(k, v, k_pool, v_pool, self.slots)
        scale = q.shape[-1] ** -0.5
        if self.query_start is None:
            return decode_attention(q, k_pool, v_pool, self.tables, self.seq_lens, scale)
        return prefill_attention(q, k_pool, v_pool, self.tables, self.query_start, self.seq_lens,
                                 self.max_query_len, scale)


class GraphDecodeAttention:
    """Decode attention over static buffers (a captured graph reads the same tensors every replay):
    ``slots`` [B] (-1: a padded row, stores nothing), ``tables`` [B, max_blocks], ``seq_lens`` [B]
    (0: a padded row, attends nothing and returns zeros)."""

    __slots__ = ("kv_cache", "slots", "tables", "seq_lens", "decode_only")

    def __init__(self, kv_cache: KVCache, slots: torch.Tensor, tables: torch.Tensor, seq_lens: torch.Tensor) -> None:
        self.kv_cache, self.slots, self.tables, self.seq_lens = kv_cache, slots, tables, seq_lens
        self.decode_only = None

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_pool, v_pool = self.kv_cache.layer(layer)
        store_kv(k, v, k_pool, v_pool, self.slots)
        return decode_attention(q, k_pool, v_pool, self.tables, self.seq_lens, q.shape[-1] ** -0.5)
