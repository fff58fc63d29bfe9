"""BlockPool: exact block ids, reference counts and eviction order (no model, no tensors)."""

from __future__ import annotations

import pytest

from swiftlm.cache.block_pool import NULL_BLOCK, BlockKey, BlockPool, NoFreeBlocksError


def key(*tokens: int, parent: int | None = None) -> BlockKey:
    return BlockKey.of(parent, tuple(tokens))


def test_allocate_hands_out_blocks_in_order_and_never_the_null_block() -> None:
    pool = BlockPool(6)
    assert pool.num_usable_blocks == 5
    assert pool.free_queue() == [1, 2, 3, 4, 5]
    assert pool.allocate(2) == [1, 2]
    assert pool.allocate(1) == [3]
    assert pool.allocate(2) == [4, 5]
    assert pool.num_free_blocks == 0
    assert pool.usage == 1.0
    assert [pool.ref_count(b) for b in range(6)] == [1, 1, 1, 1, 1, 1]
    assert NULL_BLOCK not in pool.free_queue()
    pool.check_integrity()


def test_pool_needs_a_usable_block() -> None:
    with pytest.raises(ValueError, match="at least 2 blocks"):
        BlockPool(1)


def test_free_order_is_eviction_order() -> None:
    pool = BlockPool(6)
    a = pool.allocate(3)  # [1, 2, 3]
    b = pool.allocate(2)  # [4, 5]
    pool.free(reversed(a))  # tail first: 3, 2, 1
    assert pool.free_queue() == [3, 2, 1]
    pool.free(b)
    assert pool.free_queue() == [3, 2, 1, 4, 5]
    # least recently freed first
    assert pool.allocate(2) == [3, 2]
    assert pool.free_queue() == [1, 4, 5]
    pool.free([3])
    assert pool.free_queue() == [1, 4, 5, 3]
    assert pool.allocate(4) == [1, 4, 5, 3]
    pool.check_integrity()


def test_shared_block_joins_free_queue_only_at_its_last_reference() -> None:
    pool = BlockPool(4)
    [b1, b2] = pool.allocate(2)
    pool.ref([b1])
    assert pool.ref_count(b1) == 2
    pool.free([b1, b2])
    assert pool.ref_count(b1) == 1 and pool.ref_count(b2) == 0
    assert pool.free_queue() == [3, b2]
    pool.free([b1])
    assert pool.free_queue() == [3, b2, b1]
    pool.check_integrity()


def test_ref_on_a_free_cached_block_takes_it_out_of_the_free_queue() -> None:
    pool = BlockPool(5)
    blocks = pool.allocate(3)  # [1, 2, 3]
    k = key(7, 8)
    assert pool.cache(2, k)
    pool.free(blocks)
    assert pool.free_queue() == [4, 1, 2, 3]
    assert pool.lookup(k) == 2
    pool.ref([2])
    assert pool.ref_count(2) == 1
    assert pool.free_queue() == [4, 1, 3]
    # the hit block is no longer evictable: the next three allocations skip it
    assert pool.allocate(3) == [4, 1, 3]
    assert pool.lookup(k) == 2 and pool.key_of(2) == k
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(1)
    pool.check_integrity()


def test_lazy_invalidation_freed_block_keeps_its_key_until_reallocated() -> None:
    pool = BlockPool(4)
    [b1, b2] = pool.allocate(2)
    k1, k2 = key(1, 2), key(3, 4, parent=key(1, 2).hash)
    assert pool.cache(b1, k1) and pool.cache(b2, k2)
    pool.free([b2, b1])
    assert pool.free_queue() == [3, b2, b1]
    # freed, still hit-able
    assert pool.lookup(k1) == b1 and pool.lookup(k2) == b2
    assert pool.key_of(b1) == k1
    # the never-used block goes first, then b2 (freed first): its key is dropped on reuse
    assert pool.allocate(2) == [3, b2]
    assert pool.lookup(k2) is None and pool.key_of(b2) is None
    assert pool.lookup(k1) == b1
    assert pool.allocate(1) == [b1]
    assert pool.lookup(k1) is None
    pool.check_integrity()


def test_cache_refuses_a_duplicate_key_and_a_keyed_block() -> None:
    pool = BlockPool(4)
    [b1, b2] = pool.allocate(2)
    k = key(5, 6)
    assert pool.cache(b1, k)
    assert not pool.cache(b2, k)  # the same contents are already cached in b1
    assert pool.key_of(b2) is None and pool.lookup(k) == b1
    assert not pool.cache(b1, key(9, 9))  # b1 already carries a key
    assert pool.key_of(b1) == k
    # once b1 is handed out again, b2 may carry the key
    pool.free([b1])
    assert pool.allocate(2) == [3, b1]
    assert pool.cache(b2, k) and pool.lookup(k) == b2
    pool.check_integrity()


def test_lookup_confirms_token_ids_on_hash_collision() -> None:
    pool = BlockPool(3)
    [b1] = pool.allocate(1)
    real = key(1, 2, 3)
    assert pool.cache(b1, real)
    same_hash_other_tokens = BlockKey(real.hash, None, (4, 5, 6))
    same_hash_other_parent = BlockKey(real.hash, 12345, (1, 2, 3))
    assert pool.lookup(same_hash_other_tokens) is None
    assert pool.lookup(same_hash_other_parent) is None
    assert not pool.cache(2, same_hash_other_tokens)  # a colliding key never replaces the cached one
    assert pool.lookup(real) == b1
    pool.check_integrity()


def test_no_free_blocks_error_changes_nothing() -> None:
    pool = BlockPool(4)
    assert pool.allocate(2) == [1, 2]
    with pytest.raises(NoFreeBlocksError, match="asked for 2 blocks, 1 free"):
        pool.allocate(2)
    assert pool.free_queue() == [3]
    assert pool.allocate(1) == [3]
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(1)
    pool.check_integrity()


def test_double_free_raises() -> None:
    pool = BlockPool(3)
    [b1] = pool.allocate(1)
    pool.free([b1])
    with pytest.raises(RuntimeError, match="freed more often than referenced"):
        pool.free([b1])
    pool.free([NULL_BLOCK])  # padding entries in block tables are ignored
    assert pool.ref_count(NULL_BLOCK) == 1
    pool.check_integrity()


def test_reset_cache_forgets_keys_but_keeps_blocks() -> None:
    pool = BlockPool(4)
    [b1, b2] = pool.allocate(2)
    k1, k2 = key(1), key(2, parent=key(1).hash)
    pool.cache(b1, k1)
    pool.cache(b2, k2)
    pool.free([b2])
    pool.reset_cache()
    assert pool.lookup(k1) is None and pool.lookup(k2) is None
    assert pool.key_of(b1) is None and pool.key_of(b2) is None
    assert pool.ref_count(b1) == 1 and pool.free_queue() == [3, b2]
    pool.check_integrity()


def test_check_integrity_catches_a_corrupted_pool() -> None:
    pool = BlockPool(3)
    pool.allocate(1)
    pool._ref_counts[1] = 0  # a reference lost without joining the free queue
    with pytest.raises(AssertionError, match="ref/free mismatch"):
        pool.check_integrity()


def test_a_keys_hash_is_the_sha256_of_its_parent_and_int64_ids() -> None:
    import hashlib
    from array import array

    tokens = (0, 1, 151935, 2**40, 7)
    first = BlockKey.of(None, tokens)
    assert first.hash == int.from_bytes(hashlib.sha256(b"\0" + array("q", tokens).tobytes()).digest(), "little")
    second = BlockKey.of(first.hash, tokens[:3])
    head = b"\1" + first.hash.to_bytes(32, "little")
    assert second.hash == int.from_bytes(hashlib.sha256(head + array("q", tokens[:3]).tobytes()).digest(), "little")
    assert (second.parent, second.token_ids) == (first.hash, tokens[:3])
