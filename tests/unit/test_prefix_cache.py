"""Prefix cache: chained block keys, longest-chain matching, confirmation, registration (no model)."""

from __future__ import annotations

import sys

import pytest

from swiftlm.cache.block_pool import BlockKey, BlockPool
from swiftlm.cache.prefix_cache import PrefixCache, block_keys

BS = 4


def compute(cache: PrefixCache, token_ids: list[int], hits: list[int] | None = None) -> list[int]:
    """A request that takes ``hits``, computes the rest of ``token_ids`` into new blocks, and
    registers them; returns its block ids (it still holds them)."""
    pool = cache.pool
    hits = list(hits or [])
    pool.ref(hits)
    blocks = hits + pool.allocate(-(-len(token_ids) // cache.block_size) - len(hits))
    last = pool.key_of(hits[-1]).hash if hits else None
    cache.register(token_ids, blocks, len(token_ids), len(hits), last)
    return blocks


def test_block_keys_chain_over_earlier_blocks() -> None:
    tokens = list(range(10))  # 2 full blocks of 4, 2 tokens left over
    keys = block_keys(tokens, BS)
    assert [k.token_ids for k in keys] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert keys[0].parent is None and keys[1].parent == keys[0].hash
    assert keys == [BlockKey.of(None, (0, 1, 2, 3)), BlockKey.of(keys[0].hash, (4, 5, 6, 7))]
    # the same tokens after a different first block are a different block
    other = block_keys([9, 1, 2, 3, 4, 5, 6, 7], BS)
    assert other[1].token_ids == keys[1].token_ids
    assert other[1] != keys[1] and other[1].hash != keys[1].hash
    # continuing from block 1 with block 0's hash gives the same keys
    assert block_keys(tokens, BS, start=1, parent=keys[0].hash) == keys[1:]
    assert block_keys([1, 2, 3], BS) == []
    # keys are deterministic (no per-process salt): the same history always hits
    assert BlockKey.of(None, (0, 1, 2, 3)).hash == keys[0].hash


def test_match_returns_the_longest_chain_of_hits_and_stops_at_the_first_miss() -> None:
    pool = BlockPool(10)
    cache = PrefixCache(pool, BS)
    prompt = list(range(100, 113))  # 3 full blocks + 1 token
    assert compute(cache, prompt) == [1, 2, 3, 4]
    assert cache.match(prompt, len(prompt) - 1) == [1, 2, 3]
    # diverges in block 2: blocks 0 and 1 hit
    assert cache.match(prompt[:9] + [0, 0, 0, 0, 0], 13) == [1, 2]
    # diverges in block 0: nothing hits, though blocks 1 and 2 hold the same tokens
    assert cache.match([0] + prompt[1:], 12) == []
    # a miss in the middle stops the chain: evict the second block (hand it out again)
    pool.free([2, 4, 3, 1])
    assert pool.free_queue() == [5, 6, 7, 8, 9, 2, 4, 3, 1]
    assert pool.allocate(6) == [5, 6, 7, 8, 9, 2]
    assert pool.key_of(2) is None and pool.lookup(block_keys(prompt, BS)[2]) == 3
    assert cache.match(prompt, 12) == [1]
    pool.free([5, 6, 7, 8, 9, 2])
    pool.check_integrity()


def test_match_never_covers_the_last_prompt_token() -> None:
    pool = BlockPool(6)
    cache = PrefixCache(pool, BS)
    prompt = list(range(8))  # exactly 2 full blocks
    assert compute(cache, prompt) == [1, 2]
    assert pool.key_of(2) is not None
    assert cache.match(prompt, len(prompt) - 1) == [1]  # the last token must be computed
    assert cache.match(prompt, len(prompt)) == [1, 2]  # (max_tokens is what limits it)
    assert cache.match(prompt + [8], len(prompt)) == [1, 2]
    assert cache.match(prompt[:5], 4) == [1]
    assert cache.match(prompt[:4], 3) == []
    pool.check_integrity()


def test_match_alone_counts_nothing() -> None:
    # the counters describe admitted requests, so a request retried at the head of the queue
    # is not counted again on every attempt (KVCacheManager.admit counts on success)
    cache = PrefixCache(BlockPool(6), BS)
    prompt = list(range(9))
    compute(cache, prompt)
    cache.queries = cache.hits = 0
    cache.match(prompt, 8)
    assert (cache.queries, cache.hits) == (0, 0)


def test_hit_is_confirmed_by_token_ids_when_hashes_collide(monkeypatch: pytest.MonkeyPatch) -> None:
    # every block hashes alike: only the token ids (and parent) tell blocks apart
    monkeypatch.setattr(BlockKey, "of", classmethod(lambda cls, parent, tokens: cls(42, parent, tokens)))
    pool = BlockPool(6)
    cache = PrefixCache(pool, BS)
    prompt = [1, 2, 3, 4, 5]
    assert compute(cache, prompt) == [1, 2]
    assert pool.key_of(1) == BlockKey(42, None, (1, 2, 3, 4))
    assert cache.match([9, 9, 9, 9, 5], 4) == []
    assert cache.match(prompt, 4) == [1]
    # the colliding block is computed but never cached over the first one
    assert compute(cache, [9, 9, 9, 9, 5]) == [3, 4]
    assert pool.key_of(3) is None
    assert cache.match(prompt, 4) == [1]
    pool.check_integrity()


# Two 16-token blocks (token ids below Qwen3's vocabulary size) with equal Python tuple hashes, found
# with a birthday search: the built-in hash must not key the cache, or one history's KV is served to
# another.
COLLIDING_A = (105548, 26402, 93578, 102148, 7379, 109110, 98690, 133712,
               24467, 67077, 78374, 57271, 109645, 120049, 74421, 101912)  # fmt: skip
COLLIDING_B = (43506, 34117, 79309, 25168, 32774, 66649, 151689, 142610,
               6516, 29398, 139706, 47754, 26579, 88718, 22621, 0)  # fmt: skip


def test_a_crafted_hash_collision_does_not_alias_the_blocks_after_it() -> None:
    if sys.implementation.name == "cpython" and sys.maxsize > 2**32:
        assert COLLIDING_A != COLLIDING_B and hash(COLLIDING_A) == hash(COLLIDING_B)
    bs = 16
    pool = BlockPool(4)
    cache = PrefixCache(pool, bs)
    shared = list(range(500, 516))
    first = list(COLLIDING_A) + shared
    assert compute(cache, first) == [1, 2]
    pool.free([2, 1])
    # A different history whose first block collides with ``first``'s: no hit; it computes into
    # blocks 3 and 2 (evicting block 2, ``first``'s second block) and registers them.
    second = list(COLLIDING_B) + shared
    assert cache.match(second, 31) == []
    assert compute(cache, second) == [3, 2]
    pool.free([2, 3])
    # ``first`` again: its block 0 is still cached in block 1, but block 2 now holds KV computed
    # after COLLIDING_B, which must not be served for ``shared`` after COLLIDING_A.
    assert cache.match(first + [7], 32) == [1]
    pool.check_integrity()


def test_disabled_cache_matches_and_registers_nothing() -> None:
    pool = BlockPool(6)
    cache = PrefixCache(pool, BS, enabled=False)
    prompt = list(range(9))
    blocks = pool.allocate(3)
    assert cache.register(prompt, blocks, 9, 0, None) == (0, None)
    assert [pool.key_of(b) for b in blocks] == [None, None, None]
    on = PrefixCache(pool, BS)
    on.register(prompt, blocks, 9, 0, None)  # cached by an enabled cache on the same pool
    assert cache.match(prompt, 8) == []
    assert (cache.queries, cache.hits) == (0, 0)
    pool.check_integrity()


def test_register_keys_only_full_computed_blocks_and_returns_progress() -> None:
    pool = BlockPool(6)
    cache = PrefixCache(pool, BS)
    tokens = list(range(10))
    blocks = pool.allocate(3)  # [1, 2, 3]
    keys = block_keys(tokens, BS)
    # 3 computed tokens: no block is full yet
    assert cache.register(tokens, blocks, 3, 0, None) == (0, None)
    assert pool.key_of(1) is None
    # 6 computed: block 0 is full
    assert cache.register(tokens, blocks, 6, 0, None) == (1, keys[0].hash)
    assert pool.key_of(1) == keys[0] and pool.key_of(2) is None
    # no new full block: unchanged, and block 0 is not registered twice
    assert cache.register(tokens, blocks, 7, 1, keys[0].hash) == (1, keys[0].hash)
    # 10 computed (block 1 full, block 2 partial)
    assert cache.register(tokens, blocks, 10, 1, keys[0].hash) == (2, keys[1].hash)
    assert [pool.key_of(b) for b in blocks] == [keys[0], keys[1], None]
    assert cache.match(tokens, 9) == [1, 2]
    # output tokens fill block 2: it is keyed over prompt + output
    tokens += [10, 11]
    assert cache.register(tokens, blocks, 12, 2, keys[1].hash) == (3, block_keys(tokens, BS)[2].hash)
    assert pool.key_of(3) == BlockKey.of(keys[1].hash, (8, 9, 10, 11))
    pool.check_integrity()


def test_register_after_a_refused_duplicate_keeps_chaining() -> None:
    pool = BlockPool(8)
    cache = PrefixCache(pool, BS)
    tokens = list(range(12))
    assert compute(cache, tokens[:8]) == [1, 2]
    # a second request computed the same 8 tokens (no hit: it ran concurrently) and 4 more
    blocks = pool.allocate(3)
    assert blocks == [3, 4, 5]
    assert cache.register(tokens, blocks, 12, 0, None) == (3, block_keys(tokens, BS)[2].hash)
    assert [pool.key_of(b) is None for b in blocks] == [True, True, False]
    assert cache.match(tokens + [0], 12) == [1, 2, 5]
    pool.check_integrity()


def test_match_partial_finds_the_longest_run_inside_a_cached_block() -> None:
    pool = BlockPool(12)
    cache = PrefixCache(pool, BS)
    a = compute(cache, [1, 2, 3, 4, 5, 6, 7, 8, 9])  # blocks [1, 2] keyed, 3 partial
    b = compute(cache, [1, 2, 3, 4, 5, 6, 9, 9, 9], cache.match([1, 2, 3, 4, 5], 5))  # shares block 1
    assert a[:2] == [1, 2] and b[:2] == [1, 4]
    hits = cache.match([1, 2, 3, 4, 5, 6, 7, 0, 0], 8)
    assert hits == [1]
    # both children of block 1 start 5, 6; block 2 goes on 7, 8: three tokens of it
    assert cache.match_partial([1, 2, 3, 4, 5, 6, 7, 0, 0], hits, 8) == (2, 3)
    assert cache.match_partial([1, 2, 3, 4, 5, 6, 9, 0, 0], hits, 8) == (4, 3)
    assert cache.match_partial([1, 2, 3, 4, 5, 0, 0], hits, 6) == (2, 1)  # a tie: the lower id
    # never past max_tokens, nothing when no child shares the first token, first blocks too
    assert cache.match_partial([1, 2, 3, 4, 5, 6, 7, 8], hits, 6) == (2, 2)
    assert cache.match_partial([1, 2, 3, 4, 0, 6, 7, 8], hits, 8) is None
    assert cache.match_partial([1, 2, 0, 0, 0], [], 4) == (1, 2)
    assert cache.match_partial([1, 2, 3, 4, 5], hits, 4) is None  # the hits reach max_tokens
    # an evicted block is no longer a candidate
    pool.free(list(reversed(a)) + list(reversed(b)))
    pool.allocate(pool.num_free_blocks - 1)  # hands out every free block but the last freed (1)
    pool.check_integrity()
    assert pool.children(None, (1,)) == [1] and pool.children(pool.key_of(1).hash, (5,)) == []
    assert cache.match_partial([1, 2, 3, 4, 5, 6, 7, 0], [1], 7) is None
    assert not PrefixCache(pool, BS, enabled=False).match_partial([1, 2, 3], [], 2)


def test_match_partial_needs_the_pools_child_head() -> None:
    """Candidates are indexed by their first ``child_head`` tokens: a run shorter than that is not
    looked for (the engine's pools take a quarter block)."""
    pool = BlockPool(12, child_head=2)
    cache = PrefixCache(pool, BS)
    compute(cache, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert pool.children(None, (1, 2)) == [1] and pool.children(pool.key_of(1).hash, (5, 6)) == [2]
    assert cache.match_partial([1, 2, 3, 4, 5, 6, 0, 0], [1], 7) == (2, 2)
    assert cache.match_partial([1, 2, 3, 4, 5, 0, 0, 0], [1], 7) is None  # one shared token
    assert cache.match_partial([1, 2, 3, 4, 5, 6], [1], 5) is None  # one token left before max_tokens
    pool.check_integrity()
