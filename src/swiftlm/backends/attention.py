"""Attention over the KV cache: where K/V live and how a step's queries attend to them.

An attention object is bound to one step's metadata and returns an ``Attention`` callable (see
``swiftlm.model.decoder``). Contract shared by all of them:

* the step's tokens are a flat sequence, request after request; request ``i`` owns the query
  rows ``query_start[i] : query_start[i + 1]``;
* those rows are the *last* ``q_len`` tokens of the request's context of ``seq_len`` tokens, so
  query row ``r`` (0-based within the request) sits at position ``seq_len - q_len + r`` and may
  attend to keys ``0 .. seq_len - q_len + r`` (causal, bottom-right aligned);
* the callable stores the new k/v before attending, so a request's own new tokens are visible.

``DenseAttention`` is the plain reference (one dense K/V tensor per request per layer).
``PagedAttention`` reads and writes the paged block pools; its torch implementation is the
oracle for faster ones. A backend hands it a decode kernel when the kernel supports the model
(``Backend.attention``). The bound callable of a step of decode rows alone also describes that
step (``decode_only``: slots, block tables, lengths, pools): the interface through which an op
that runs whole layers stores K/V and attends exactly as the callable would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from swiftlm.backends.kv_cache import KVCache
from swiftlm.core.step import AttentionMetadata

AttentionFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One request. q: [q_len, Hq, D]; k, v: [kv_len, Hkv, D] with q the last q_len of kv.

    Returns [q_len, Hq, D]. K/V heads are repeated to the query heads (rather than SDPA's GQA
    mode) so that reduced-precision results round exactly as the reference implementation's.
    """
    q_len, kv_len = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    qh = q.transpose(0, 1).unsqueeze(0)  # [1, Hq, q_len, D]
    kh = k.transpose(0, 1).repeat_interleave(group, dim=0).unsqueeze(0)  # [1, Hq, kv_len, D]
    vh = v.transpose(0, 1).repeat_interleave(group, dim=0).unsqueeze(0)
    if q_len == kv_len:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=q_len > 1)
    elif q_len == 1:
        out = F.scaled_dot_product_attention(qh, kh, vh)
    else:
        rows = torch.arange(q_len, device=q.device).unsqueeze(1) + (kv_len - q_len)
        mask = torch.arange(kv_len, device=q.device).unsqueeze(0) <= rows  # [q_len, kv_len]
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
    return out[0].transpose(0, 1)


class DenseAttention:
    """Plain reference backend: each request keeps one growing K/V tensor per layer."""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self._kv: dict[str, list[tuple[torch.Tensor, torch.Tensor] | None]] = {}

    def bind(self, request_ids: Sequence[str], query_lens: Sequence[int]) -> AttentionFn:
        for rid in request_ids:
            self._kv.setdefault(rid, [None] * self.num_layers)
        bounds = [0]
        for n in query_lens:
            bounds.append(bounds[-1] + n)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            outs = []
            for i, rid in enumerate(request_ids):
                lo, hi = bounds[i], bounds[i + 1]
                cached = self._kv[rid][layer]
                k_all = k[lo:hi] if cached is None else torch.cat((cached[0], k[lo:hi]))
                v_all = v[lo:hi] if cached is None else torch.cat((cached[1], v[lo:hi]))
                self._kv[rid][layer] = (k_all, v_all)
                outs.append(causal_attention(q[lo:hi], k_all, v_all))
            return torch.cat(outs) if len(outs) > 1 else outs[0]

        return attend

    def release(self, request_id: str) -> None:
        self._kv.pop(request_id, None)


# (q, k_pool, v_pool, block_tables, seq_lens, scale, k_scales, v_scales) -> out; scales None: unscaled pools
DecodeKernel = Callable[..., torch.Tensor]
# (q [T, Hq, D], k_pool, v_pool, block_table [n_blocks], seq_len, scale, k_scales, v_scales) -> [T, Hq, D]
PrefillKernel = Callable[..., torch.Tensor]


# With a decode kernel, a request of at most this many query rows (drafts being verified, a short
# chunk after a long context) attends as that many decode rows, row j over keys 0 .. its position,
# instead of gathering its whole context for SDPA
SHORT_CHUNK_ROWS = 16


class PagedAttention:
    """Attention over the paged KV pools.

    Prefill chunks gather their blocks and run SDPA, or, given a ``prefill_kernel`` (a paged flash
    attention reading the pools through the block table, ``backends/cpu/kernels/prefill_attention_cpu.py``),
    call it per chunk. Decode requests (one query each) are
    batched: through ``decode_kernel`` when one is given (a fused kernel that reads each K/V
    row once, see ``swiftlm.backends.cpu.kernels.attention_cpu``), else in plain torch as one padded SDPA
    call with a length mask (the oracle the kernel is tested against). With the kernel, a chunk of
    up to ``SHORT_CHUNK_ROWS`` rows joins the decode batch as one row per query (causal: row j
    sees one key more than row j - 1), so verifying a few drafts costs no gather of the context.
    """

    def __init__(self, kv_cache: KVCache, decode_kernel: DecodeKernel | None = None,
                 prefill_kernel: PrefillKernel | None = None) -> None:
        self.kv_cache = kv_cache
        self.decode_kernel = decode_kernel
        self.prefill_kernel = prefill_kernel
        # fixed for the cache's life: every layer's K and V pools and scale pools
        self._pools = (*kv_cache.pools(), *kv_cache.scale_pools())

    def bind(self, meta: AttentionMetadata) -> BoundPagedAttention:
        decode = _DecodeBatch.build(meta, self.kv_cache.block_size, self.decode_kernel)
        return BoundPagedAttention(self.kv_cache, meta, decode, self._pools, self.prefill_kernel)


@dataclass(frozen=True, slots=True)
class DecodeOnlyStep:
    """A step of decode rows alone, in order, through the decode kernel: what an op that runs whole
    layers needs to store K/V and attend exactly as ``BoundPagedAttention`` would."""

    slot_mapping: torch.Tensor  # [T] int64
    block_tables: torch.Tensor  # [T, max_blocks] int64
    seq_lens: torch.Tensor  # [T] int64
    k_pools: list[torch.Tensor]  # per layer [num_blocks, block_size, Hkv, D]
    v_pools: list[torch.Tensor]
    k_scales: list[torch.Tensor]  # per layer [num_blocks, block_size, Hkv] float32; empty: unscaled pools
    v_scales: list[torch.Tensor]


class BoundAttention(Protocol):
    """A step's attention callable (``model.qwen3.Attention``) that may describe a decode-only step."""

    decode_only: DecodeOnlyStep | None

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class BoundPagedAttention:
    """``PagedAttention`` bound to one step: the ``Attention`` callable of the model's forward."""

    __slots__ = ("kv_cache", "meta", "decode", "decode_only", "prefill_kernel")

    def __init__(
        self, kv_cache: KVCache, meta: AttentionMetadata, decode: _DecodeBatch | None,
        pools: tuple[list[torch.Tensor], ...], prefill_kernel: PrefillKernel | None = None,
    ) -> None:
        self.kv_cache, self.meta, self.decode = kv_cache, meta, decode
        self.prefill_kernel = prefill_kernel
        self.decode_only: DecodeOnlyStep | None = None
        if decode is not None and decode.whole_batch and decode.kernel is not None:
            k_pools, v_pools, k_scales, v_scales = pools
            self.decode_only = DecodeOnlyStep(meta.slot_mapping, decode.block_tables, decode.seq_lens, k_pools, v_pools,
                                              k_scales, v_scales)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta, decode, cache = self.meta, self.decode, self.kv_cache
        cache.store(layer, meta.slot_mapping, k, v)
        if decode is not None and decode.whole_batch:  # decode-only step: no gather or scatter
            return decode.attend(q, cache, layer)
        bs = cache.block_size
        out = torch.empty_like(q)
        for r in meta.prefill_rows:
            if decode is not None and r in decode.chunk_rows:
                continue  # attends in the decode batch below
            lo, hi, seq_len = meta.query_start[r], meta.query_start[r + 1], meta.seq_lens[r]
            n_blocks = (seq_len + bs - 1) // bs
            if self.prefill_kernel is not None:  # reads the pools through the table: no gather
                k_pool, v_pool = cache.layer(layer)
                scales = cache.layer_scales(layer)
                k_scale, v_scale = scales if scales is not None else (None, None)
                out[lo:hi] = self.prefill_kernel(q[lo:hi], k_pool, v_pool, meta.block_tables[r, :n_blocks], seq_len,
                                                 q.shape[-1] ** -0.5, k_scale, v_scale)
                continue
            k_blocks, v_blocks = cache.gather(layer, meta.block_tables[r, :n_blocks])  # [n_blocks, bs, Hkv, D]
            n_kv, d = k_blocks.shape[2], k_blocks.shape[3]
            k_ctx = k_blocks.view(-1, n_kv, d)[:seq_len]  # [seq_len, Hkv, D]
            v_ctx = v_blocks.view(-1, n_kv, d)[:seq_len]
            out[lo:hi] = causal_attention(q[lo:hi], k_ctx, v_ctx)
        if decode is not None:
            out[decode.rows] = decode.attend(q[decode.rows], cache, layer)
        return out


@dataclass(slots=True)
class _DecodeBatch:
    rows: torch.Tensor  # [B] flat-batch row of each decode query
    block_tables: torch.Tensor  # [B, max_blocks]
    seq_lens: torch.Tensor  # [B]
    mask: torch.Tensor | None  # [B, 1, 1, max_blocks * block_size] True where a key is in context
    kernel: DecodeKernel | None
    whole_batch: bool  # the step is these decode rows alone, in order: q needs no gather
    chunk_rows: frozenset[int]  # requests of several query rows attending here, one row per query

    @classmethod
    def build(cls, meta: AttentionMetadata, block_size: int, kernel: DecodeKernel | None) -> _DecodeBatch | None:
        qs = meta.query_start
        chunks = [r for r in meta.prefill_rows if qs[r + 1] - qs[r] <= SHORT_CHUNK_ROWS] if kernel is not None else []
        if not meta.decode_rows and not chunks:
            return None
        idx: list[int] = list(meta.decode_rows)  # the request of each decode query
        if not meta.prefill_rows:  # one row per request, in order: the step's lists as they are
            seq_lens, starts = meta.seq_lens, qs[:-1]
        else:
            seq_lens = [meta.seq_lens[r] for r in idx]
            starts = [qs[r] for r in idx]
        for r in chunks:  # query row j of a chunk of n sits at position seq_len - n + j: keys up to it
            n = qs[r + 1] - qs[r]
            idx += [r] * n
            seq_lens += [meta.seq_lens[r] - n + 1 + j for j in range(n)]
            starts += range(qs[r], qs[r + 1])
        device = meta.block_tables.device  # the step's device: no host tensor meets a device one
        # decode rows alone: one query row per request, in order (query_start is 0, 1, ..., R)
        whole = not meta.prefill_rows and qs[-1] == len(idx)
        lens = meta.seq_lens_tensor if whole and meta.seq_lens_tensor is not None else torch.tensor(seq_lens, device=device)
        max_blocks = (max(seq_lens) + block_size - 1) // block_size
        # the whole batch in order: the step's table as it is (no index copy)
        tables = meta.block_tables[:, :max_blocks] if whole else meta.block_tables[idx, :max_blocks]
        mask = None
        if kernel is None:
            keys = torch.arange(max_blocks * block_size, device=device)
            mask = (keys.unsqueeze(0) < lens.unsqueeze(1)).view(len(idx), 1, 1, -1)
        rows = torch.arange(len(idx), device=device) if whole else torch.tensor(starts, device=device)
        return cls(rows=rows, block_tables=tables.contiguous(), seq_lens=lens, mask=mask,
                   kernel=kernel, whole_batch=whole, chunk_rows=frozenset(chunks))

    def attend(self, q: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
        # q: [B, Hq, D] -> gathered keys [B, max_blocks * block_size, Hkv, D]
        if self.kernel is not None:
            k_pool, v_pool = cache.layer(layer)
            scales = cache.layer_scales(layer)
            k_scale, v_scale = scales if scales is not None else (None, None)
            return self.kernel(q.contiguous(), k_pool, v_pool, self.block_tables, self.seq_lens, q.shape[-1] ** -0.5,
                               k_scale, v_scale)
        b = q.shape[0]
        k_blocks, v_blocks = cache.gather(layer, self.block_tables)  # [B, max_blocks, bs, Hkv, D]
        n_kv, d = k_blocks.shape[-2], k_blocks.shape[-1]
        k = k_blocks.view(b, -1, n_kv, d).transpose(1, 2)  # [B, Hkv, L, D]
        v = v_blocks.view(b, -1, n_kv, d).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), k, v, attn_mask=self.mask, enable_gqa=True
        )  # [B, Hq, 1, D]
        return out.squeeze(2)
