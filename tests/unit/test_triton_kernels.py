"""The CUDA backend's Triton kernels under Triton's interpreter (CPU tensors) against the torch
reference: ``KVCache.store`` and ``PagedAttention`` (gather + SDPA) of ``backends/``.

Each case builds a step over paged pools filled with random values (stale values in every block, so
a wrong block or a key past a sequence's end changes the answer), blocks handed out in shuffled
order, block tables padded with the null block. float32 must match the float32 reference to 1e-5;
bfloat16 is compared with both bfloat16 paths' distance from a float64 reference."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch

from swiftlm.backends.attention import PagedAttention
from swiftlm.backends.kv_cache import KVCache
from swiftlm.config import ModelConfig
from swiftlm.core.step import AttentionMetadata
from tests.unit.triton_interpreted import import_interpreted, interpreter_env, triton_installed

if not triton_installed():
    pytest.fail("triton is not installed: pip install -e .[test]", pytrace=False)

MODULES = import_interpreted()
store_kv = MODULES["store_kv"].store_kv
decode_attention = MODULES["decode_attention"].decode_attention
prefill_attention = MODULES["prefill_attention"].prefill_attention
TritonPagedAttention = MODULES["attention"].TritonPagedAttention


@pytest.fixture(autouse=True, scope="module")
def _interpreter() -> Iterator[None]:
    with interpreter_env():
        yield


@dataclass
class Step:
    meta: AttentionMetadata
    q: torch.Tensor  # [T, Hq, D] float64
    k: torch.Tensor  # [T, Hkv, D]
    v: torch.Tensor
    k_pool: torch.Tensor  # [num_blocks, block_size, Hkv, D] float64, before the step's store
    v_pool: torch.Tensor
    config: ModelConfig


def make_step(requests: list[tuple[int, int]], block_size: int, hq: int, hkv: int, d: int, seed: int = 0) -> Step:
    """``requests``: (tokens cached before the step, new tokens) per request."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    need = [(c + n + block_size - 1) // block_size for c, n in requests]
    num_blocks = sum(need) + 3
    free = list(range(1, num_blocks))  # block 0 is the null block
    rng.shuffle(free)
    tables, slots, query_start, seq_lens = [], [], [0], []
    for (c, n), nb in zip(requests, need, strict=True):
        blocks = [free.pop() for _ in range(nb)]
        tables.append(blocks)
        slots += [blocks[p // block_size] * block_size + p % block_size for p in range(c, c + n)]
        query_start.append(query_start[-1] + n)
        seq_lens.append(c + n)
    width = max(need) + 1  # one column more than any request needs: padding is read as the null block
    table = torch.tensor([b + [0] * (width - len(b)) for b in tables], dtype=torch.int64)
    t = query_start[-1]
    meta = AttentionMetadata(
        query_start=query_start, seq_lens=seq_lens, slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_tables=table, decode_rows=[i for i, (_, n) in enumerate(requests) if n == 1],
        prefill_rows=[i for i, (_, n) in enumerate(requests) if n > 1],
    )
    f64 = dict(dtype=torch.float64, generator=gen)
    config = ModelConfig(vocab_size=16, hidden_size=hq * d, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=hq, num_key_value_heads=hkv, head_dim=d)
    return Step(meta, torch.randn(t, hq, d, **f64), torch.randn(t, hkv, d, **f64), torch.randn(t, hkv, d, **f64),
                torch.randn(num_blocks, block_size, hkv, d, **f64), torch.randn(num_blocks, block_size, hkv, d, **f64),
                config)


def cache_of(step: Step, dtype: torch.dtype) -> KVCache:
    pools = iter((step.k_pool.to(dtype), step.v_pool.to(dtype)))
    return KVCache(step.config, step.k_pool.shape[0], step.k_pool.shape[1], dtype,
                   allocate=lambda shapes, dt: [next(pools) for _ in shapes])


def reference(step: Step, dtype: torch.dtype) -> tuple[torch.Tensor, KVCache]:
    """The torch path: ``KVCache.store`` + gather + SDPA, in ``dtype``."""
    cache = cache_of(step, dtype)
    out = PagedAttention(cache).bind(step.meta)(0, step.q.to(dtype), step.k.to(dtype), step.v.to(dtype))
    return out, cache


def triton_path(step: Step, dtype: torch.dtype) -> tuple[torch.Tensor, KVCache]:
    """The CUDA backend's path: store_kv, then the decode kernel (decode-only steps) or the prefill kernel."""
    cache = cache_of(step, dtype)
    out = TritonPagedAttention(cache).bind(step.meta)(0, step.q.to(dtype), step.k.to(dtype), step.v.to(dtype))
    return out, cache


def assert_fp32_matches(step: Step) -> None:
    ref, ref_cache = reference(step, torch.float32)
    got, got_cache = triton_path(step, torch.float32)
    for a, b in zip(ref_cache.layer(0), got_cache.layer(0), strict=True):
        assert torch.equal(a, b)  # the store wrote exactly the reference's slots and nothing else
    err = (got - ref).abs().max().item()
    assert err <= 1e-5, err
    exact, _ = reference(step, torch.float64)
    assert (got.double() - exact).abs().max().item() <= 1e-5


# block_size 4: at, before, after block boundaries; 64, 65, 130: at and past the kernel's 64-key tiles
@pytest.mark.parametrize("seq_len", [1, 4, 5, 7, 8, 9, 64, 65, 130])
def test_decode_at_block_boundaries(seq_len: int) -> None:
    assert_fp32_matches(make_step([(seq_len - 1, 1), (2, 1)], block_size=4, hq=2, hkv=2, d=16, seed=seq_len))


@pytest.mark.parametrize(("hq", "hkv", "d"), [(4, 4, 16), (4, 2, 32), (8, 2, 24), (6, 2, 24), (3, 1, 20), (5, 5, 8)])
def test_decode_gqa_ratios_and_head_dims(hq: int, hkv: int, d: int) -> None:
    """Groups 1, 2, 4 and the odd 3; head_dim 24, 20, 8 (not powers of 2, or under a tile): masked."""
    assert_fp32_matches(make_step([(11, 1), (0, 1), (36, 1)], block_size=8, hq=hq, hkv=hkv, d=d, seed=hq + d))


@pytest.mark.parametrize(
    "requests",
    [
        [(0, 7)],  # cold prompt, not a multiple of the block size
        [(8, 5)],  # a prefix hit of two whole blocks, then a chunk
        [(6, 3), (0, 1)],  # chunk starting mid-block, beside a decode row of an empty context
        [(100, 70), (3, 1), (0, 66)],  # chunks over several 64-row query and 64-key tiles, with a decode row
    ],
    ids=["cold", "prefix-hit", "mid-block", "tiles"],
)
@pytest.mark.parametrize(("hq", "hkv"), [(4, 2), (6, 2), (3, 3)])
def test_prefill_chunks_over_cached_blocks(requests: list[tuple[int, int]], hq: int, hkv: int) -> None:
    assert_fp32_matches(make_step(requests, block_size=4, hq=hq, hkv=hkv, d=24, seed=len(requests) + hq))


def test_prefill_kernel_serves_decode_rows_too() -> None:
    """A decode row is a chunk of one: the prefill kernel agrees with the decode kernel on it."""
    step = make_step([(9, 1), (20, 1), (0, 1)], block_size=4, hq=4, hkv=2, d=16, seed=3)
    cache = cache_of(step, torch.float32)
    k_pool, v_pool = cache.layer(0)
    q = step.q.float()
    store_kv(step.k.float(), step.v.float(), k_pool, v_pool, step.meta.slot_mapping)
    lens = torch.tensor(step.meta.seq_lens, dtype=torch.int32)
    starts = torch.tensor(step.meta.query_start, dtype=torch.int32)
    decode = decode_attention(q, k_pool, v_pool, step.meta.block_tables, lens, 0.25)
    prefill = prefill_attention(q, k_pool, v_pool, step.meta.block_tables, starts, lens, 1, 0.25)
    assert (decode - prefill).abs().max().item() <= 1e-6


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_bfloat16_within_the_references_own_error(kind: str) -> None:
    """bf16 inputs, float32 accumulation: no further from the float64 answer than the bf16 reference is."""
    requests = [(13, 1), (90, 1), (5, 1)] if kind == "decode" else [(8, 9), (0, 70), (21, 1)]
    step = make_step(requests, block_size=4, hq=6, hkv=2, d=24, seed=11)
    exact, _ = reference(step, torch.float64)
    ref, ref_cache = reference(step, torch.bfloat16)
    got, got_cache = triton_path(step, torch.bfloat16)
    assert got.dtype == torch.bfloat16
    for a, b in zip(ref_cache.layer(0), got_cache.layer(0), strict=True):
        assert torch.equal(a, b)
    ref_err = (ref.double() - exact).abs().max().item()
    got_err = (got.double() - exact).abs().max().item()
    assert 0 < ref_err < 0.05  # the reference's own bf16 error: rounding of inputs, scores and output
    assert got_err <= ref_err * 1.5, (got_err, ref_err)


def test_store_skips_padding_slots_and_casts() -> None:
    """Slot -1 (a padded graph row) writes nothing; float32 rows are stored as the pool's bf16."""
    k_pool = torch.zeros(3, 4, 2, 6, dtype=torch.bfloat16)
    v_pool = torch.zeros_like(k_pool)
    k, v = torch.randn(3, 2, 6), torch.randn(3, 2, 6)
    store_kv(k, v, k_pool, v_pool, torch.tensor([5, -1, 11]))
    flat_k, flat_v = k_pool.view(-1, 2, 6), v_pool.view(-1, 2, 6)
    assert torch.equal(flat_k[5], k[0].bfloat16()) and torch.equal(flat_v[11], v[2].bfloat16())
    written = torch.zeros(12, dtype=torch.bool)
    written[[5, 11]] = True
    assert not flat_k[~written].any() and not flat_v[~written].any()


def test_decode_row_of_no_keys_gives_zeros() -> None:
    """A padded graph row (seq_len 0) attends nothing: zeros, not NaN."""
    k_pool = torch.randn(2, 4, 1, 16)
    out = decode_attention(torch.randn(2, 2, 16), k_pool, k_pool.clone(), torch.zeros(2, 1, dtype=torch.int64),
                           torch.tensor([0, 3], dtype=torch.int32), 0.25)
    assert torch.equal(out[0], torch.zeros(2, 16)) and torch.isfinite(out[1]).all() and out[1].abs().sum() > 0
