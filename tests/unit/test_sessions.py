"""Sessions: pinned conversation KV, reuse on the next turn, TTL, budget, release order (no model)."""

from __future__ import annotations

import pytest

from swiftlm.cache.block_pool import NoFreeBlocksError
from swiftlm.cache.kv_manager import KVCacheManager
from swiftlm.core.request import Request
from swiftlm.sampling import SamplingParams

BS = 4
HISTORY = list(range(100, 111))  # 11 tokens: a turn's prompt + output; the last one never computed


def make_kv(num_blocks: int = 12, ttl: float = 10.0, max_session_tokens: int | None = 1000) -> KVCacheManager:
    return KVCacheManager(num_blocks, BS, session_ttl=ttl, max_session_tokens=max_session_tokens)


def finished_turn(kv: KVCacheManager, tokens: list[int], num_computed: int, extra: int = 0) -> list[int]:
    """Blocks of a turn that computed ``num_computed`` of ``tokens`` (full ones keyed)."""
    blocks = kv.pool.allocate(-(-num_computed // BS) + extra)
    kv.prefix_cache.register(tokens, blocks, num_computed, 0, None)
    return blocks


def owner(blocks: list[int]) -> Request:
    """A live request holding ``blocks`` (for check_integrity)."""
    r = Request(request_id="r", prompt_token_ids=[0], sampling_params=SamplingParams(), arrival_time=0.0)
    r.block_ids = list(blocks)
    return r


def put_history(
    kv: KVCacheManager, sid: str = "s", now: float = 0.0, tokens: list[int] = HISTORY
) -> list[int]:
    blocks = finished_turn(kv, tokens, len(tokens) - 1)
    kv.sessions.put(sid, list(tokens), blocks, len(tokens) - 1, now)
    return blocks


def test_put_pins_the_turns_blocks_and_frees_the_rest() -> None:
    kv = make_kv()
    blocks = finished_turn(kv, HISTORY, 10, extra=1)  # one block too many (never written)
    assert blocks == [1, 2, 3, 4]
    kv.pool.ref([1])  # block 1 is also held by another request (a prefix hit)
    kv.sessions.put("s", list(HISTORY), blocks, 10, now=0.0)
    session = kv.sessions.get("s")
    assert session is not None and session.block_ids == [1, 2, 3] and session.num_computed == 10
    assert [kv.pool.ref_count(b) for b in (1, 2, 3, 4)] == [2, 1, 1, 0]
    assert kv.sessions.pinned_blocks() == {1, 2, 3}
    assert kv.pool.free_queue() == [5, 6, 7, 8, 9, 10, 11, 4]
    assert kv.sessions.num_tokens == 10 and len(kv.sessions) == 1 and "s" in kv.sessions
    kv.check_integrity([owner([1])])
    # pinned blocks are never handed out, even when everything else is
    assert kv.pool.allocate(8) == [5, 6, 7, 8, 9, 10, 11, 4]
    with pytest.raises(NoFreeBlocksError):
        kv.pool.allocate(1)
    kv.check_integrity([owner([1]), owner([5, 6, 7, 8, 9, 10, 11, 4])])


def test_take_reuses_the_whole_history_including_the_partial_last_block() -> None:
    kv = make_kv()
    assert put_history(kv) == [1, 2, 3]  # tokens 8, 9 computed in block 3, unkeyed
    assert kv.pool.key_of(3) is None
    prompt = HISTORY + [200, 201]
    assert kv.sessions.reusable("s", prompt, now=1.0) == (10, 3)
    hit = kv.sessions.take("s", prompt, now=1.0)
    assert hit is not None and hit.block_ids == [1, 2, 3] and hit.num_computed == 10
    assert "s" not in kv.sessions and kv.sessions.pinned_blocks() == set()
    assert [kv.pool.ref_count(b) for b in (1, 2, 3)] == [1, 1, 1]  # now the request's references
    kv.check_integrity([owner(hit.block_ids)])


def test_divergent_prompt_reuses_only_the_common_prefix() -> None:
    kv = make_kv()
    put_history(kv)
    # diverges at token 6, inside block 1 which is full and keyed: it must not be overwritten
    prompt = HISTORY[:6] + [0, 0, 0]
    assert kv.sessions.reusable("s", prompt, now=0.0) == (4, 1)
    hit = kv.sessions.take("s", prompt, now=0.0)
    assert hit is not None and hit.block_ids == [1] and hit.num_computed == 4
    assert kv.pool.free_queue() == [4, 5, 6, 7, 8, 9, 10, 11, 3, 2]  # dropped tail first
    assert kv.pool.key_of(2) is not None  # dropped, still cached
    kv.check_integrity([owner([1])])


def test_divergence_inside_the_unkeyed_tail_block_keeps_it() -> None:
    kv = make_kv()
    put_history(kv)
    prompt = HISTORY[:9] + [0, 0]  # diverges at token 9, in block 2 (tokens 8..9 computed)
    assert kv.sessions.reusable("s", prompt, now=0.0) == (9, 3)
    hit = kv.sessions.take("s", prompt, now=0.0)
    assert hit is not None and hit.block_ids == [1, 2, 3] and hit.num_computed == 9
    kv.check_integrity([owner(hit.block_ids)])


def test_shared_partial_tail_block_is_not_reused() -> None:
    kv = make_kv()
    put_history(kv)
    kv.pool.ref([3])  # someone else reads the tail block
    prompt = HISTORY + [200]
    assert kv.sessions.reusable("s", prompt, now=0.0) == (8, 2)
    hit = kv.sessions.take("s", prompt, now=0.0)
    assert hit is not None and hit.block_ids == [1, 2] and hit.num_computed == 8
    assert kv.pool.ref_count(3) == 1
    kv.check_integrity([owner([1, 2]), owner([3])])


def test_reusable_never_exceeds_the_prompt_minus_one() -> None:
    kv = make_kv()
    put_history(kv)
    # the same 11 tokens again: 10 computed, and 10 = len(prompt) - 1
    assert kv.sessions.reusable("s", HISTORY, now=0.0) == (10, 3)
    assert kv.sessions.reusable("s", HISTORY[:10], now=0.0) == (9, 3)  # block 3 (unkeyed) kept
    assert kv.sessions.reusable("s", HISTORY[:9], now=0.0) == (8, 2)
    assert kv.sessions.reusable("s", HISTORY[:6], now=0.0) == (4, 1)  # block 1 keyed: dropped
    assert kv.sessions.reusable("s", HISTORY[:1], now=0.0) == (0, 0)
    assert kv.sessions.reusable("s", [], now=0.0) == (0, 0)
    for n in range(1, len(HISTORY) + 3):
        prompt = (HISTORY + [7, 7])[:n]
        tokens, _ = kv.sessions.reusable("s", prompt, now=0.0)
        assert tokens <= n - 1
    # a prompt that shares nothing: take releases the session and returns None
    assert kv.sessions.take("s", [1, 2, 3], now=0.0) is None
    assert "s" not in kv.sessions and kv.pool.free_queue()[-3:] == [3, 2, 1]
    kv.check_integrity([])


def test_ttl_expiry_releases_the_session() -> None:
    kv = make_kv(ttl=10.0)
    put_history(kv, "old", now=0.0)
    put_history(kv, "new", now=5.0)  # the same history: its full blocks are duplicates, unkeyed
    assert kv.sessions.get("new").block_ids == [4, 5, 6]
    assert kv.sessions.expire(now=10.0) == 0  # exactly ttl: still alive
    assert kv.sessions.reusable("old", HISTORY + [1], now=10.5) == (0, 0)
    assert kv.sessions.expire(now=10.5) == 1
    assert "old" not in kv.sessions and "new" in kv.sessions
    assert kv.pool.free_queue() == [7, 8, 9, 10, 11, 3, 2, 1]
    # an expired session found by take is released and gives nothing
    assert kv.sessions.take("new", HISTORY + [1], now=20.0) is None
    assert len(kv.sessions) == 0
    assert kv.pool.free_queue() == [7, 8, 9, 10, 11, 3, 2, 1, 6, 5, 4]
    kv.check_integrity([])


def test_close_releases_at_once() -> None:
    kv = make_kv()
    put_history(kv)
    assert kv.sessions.close("s")
    assert not kv.sessions.close("s")
    assert not kv.sessions.close("unknown")
    assert [kv.pool.ref_count(b) for b in (1, 2, 3)] == [0, 0, 0]
    assert kv.pool.free_queue() == [4, 5, 6, 7, 8, 9, 10, 11, 3, 2, 1]
    assert kv.prefix_cache.match(HISTORY, 10) == [1, 2]  # released, still cached
    kv.check_integrity([])


def test_release_oldest_goes_in_least_recently_used_order() -> None:
    kv = make_kv(num_blocks=16)
    put_history(kv, "a", now=0.0, tokens=[1] * 5)  # 4 computed: 1 block each
    put_history(kv, "b", now=1.0, tokens=[2] * 5)
    put_history(kv, "c", now=2.0, tokens=[3] * 5)
    assert [s.session_id for s in kv.sessions.all()] == ["a", "b", "c"]
    assert [s.block_ids for s in kv.sessions.all()] == [[1], [2], [3]]
    # a new turn of "a" (take, then put) makes it the most recent
    hit = kv.sessions.take("a", [1] * 5 + [9], now=3.0)
    assert hit is not None and hit.block_ids == [1] and hit.num_computed == 4
    kv.sessions.put("a", [1] * 7, hit.block_ids + kv.pool.allocate(1), 6, now=3.0)
    assert [s.session_id for s in kv.sessions.all()] == ["b", "c", "a"]
    assert kv.sessions.release_oldest()
    assert [s.session_id for s in kv.sessions.all()] == ["c", "a"]
    assert kv.sessions.release_oldest(exclude="c")
    assert [s.session_id for s in kv.sessions.all()] == ["c"]
    assert not kv.sessions.release_oldest(exclude="c")
    assert kv.sessions.release_oldest()
    assert not kv.sessions.release_oldest()
    kv.check_integrity([])


def test_put_over_an_existing_session_keeps_the_newest() -> None:
    kv = make_kv()
    put_history(kv, "s", now=0.0)
    newer = finished_turn(kv, [5] * 6, 5)
    kv.sessions.put("s", [5] * 6, newer, 5, now=1.0)
    assert len(kv.sessions) == 1 and kv.sessions.get("s").block_ids == newer == [4, 5]
    assert [kv.pool.ref_count(b) for b in (1, 2, 3)] == [0, 0, 0]
    kv.check_integrity([])


def test_budget_releases_the_oldest_sessions_first() -> None:
    kv = make_kv(num_blocks=16, max_session_tokens=20)
    put_history(kv, "a", now=0.0, tokens=[1] * 9)  # 8 tokens each
    put_history(kv, "b", now=1.0, tokens=[2] * 9)
    assert kv.sessions.num_tokens == 16
    put_history(kv, "c", now=2.0, tokens=[3] * 9)  # 24 > 20: "a" goes
    assert [s.session_id for s in kv.sessions.all()] == ["b", "c"]
    assert kv.sessions.num_tokens == 16
    assert kv.pool.free_queue()[-2:] == [2, 1]
    # a session larger than the whole budget does not stay either
    put_history(kv, "d", now=3.0, tokens=[4] * 25)  # 24 tokens
    assert len(kv.sessions) == 0 and kv.sessions.num_tokens == 0
    kv.check_integrity([])
