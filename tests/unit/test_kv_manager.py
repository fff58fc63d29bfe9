"""KVCacheManager: admission with prefix-cache and session reuse, memory pressure, finished turns."""

from __future__ import annotations

from swiftlm.cache.kv_manager import KVCacheManager
from swiftlm.core.request import FinishReason, Request
from swiftlm.sampling import SamplingParams

BS = 4


def req(rid: str, tokens: list[int], session_id: str | None = None) -> Request:
    return Request(
        request_id=rid,
        prompt_token_ids=list(tokens),
        sampling_params=SamplingParams(),
        arrival_time=0.0,
        session_id=session_id,
    )


def run_prompt(kv: KVCacheManager, r: Request, sampled: int | None = 999) -> None:
    """Admit ``r`` with an unlimited budget, compute its prompt and (optionally) sample a token."""
    n = kv.admit(r, 10_000, now=0.0)
    assert n == r.num_tokens - r.num_computed_tokens
    r.num_computed_tokens += n
    kv.register_computed(r)
    if sampled is not None:
        r.append_output(sampled)


def finish(
    kv: KVCacheManager, r: Request, reason: FinishReason = FinishReason.STOP, now: float = 0.0
) -> None:
    r.finish_reason = reason
    kv.release_finished(r, now)


def state(kv: KVCacheManager) -> tuple:
    pool = kv.pool
    return (
        pool.free_queue(),
        [pool.ref_count(b) for b in range(pool.num_blocks)],
        [pool.key_of(b) for b in range(pool.num_blocks)],
        [(s.session_id, list(s.block_ids), s.num_computed) for s in kv.sessions.all()],
    )


def test_admit_reuses_prefix_hits() -> None:
    kv = KVCacheManager(12, BS)
    prompt = list(range(10))
    r1 = req("r1", prompt)
    run_prompt(kv, r1)
    assert r1.block_ids == [1, 2, 3] and r1.num_registered_blocks == 2
    kv.check_integrity([r1])
    finish(kv, r1)
    assert kv.pool.free_queue() == [4, 5, 6, 7, 8, 9, 10, 11, 3, 2, 1]

    r2 = req("r2", prompt[:8] + [50, 51, 52])
    assert kv.admit(r2, 10_000, now=0.0) == 3
    assert r2.num_computed_tokens == 8  # 2 hits x 4 tokens
    assert r2.block_ids == [1, 2, 4]
    assert r2.num_registered_blocks == 2 and r2.last_block_hash == kv.pool.key_of(2).hash
    assert [kv.pool.ref_count(b) for b in (1, 2, 4)] == [1, 1, 1]
    assert kv.pool.free_queue() == [5, 6, 7, 8, 9, 10, 11, 3]
    kv.check_integrity([r2])

    # a third request on the same prefix shares the blocks while r2 holds them; a small budget
    # gives it blocks for its first chunk only
    r3 = req("r3", prompt[:8] + [60, 61, 62, 63, 64])
    assert kv.admit(r3, 2, now=0.0) == 2
    assert r3.num_computed_tokens == 8 and r3.block_ids == [1, 2, 5]
    assert [kv.pool.ref_count(b) for b in (1, 2)] == [2, 2]
    kv.check_integrity([r2, r3])
    kv.free(r3)
    kv.free(r2)
    assert kv.pool.free_queue() == [6, 7, 8, 9, 10, 11, 3, 5, 4, 2, 1]
    kv.check_integrity([])


def test_admit_returns_zero_and_changes_nothing_when_blocks_are_short() -> None:
    kv = KVCacheManager(6, BS)
    prompt = list(range(8))
    r0 = req("r0", prompt)
    run_prompt(kv, r0, sampled=None)
    assert r0.block_ids == [1, 2]
    kv.free(r0)
    r1 = req("r1", [90] * 12)
    run_prompt(kv, r1)
    assert r1.block_ids == [3, 4, 5]
    assert kv.pool.free_queue() == [2, 1]  # both cached blocks of ``prompt``
    # r2 would hit blocks 1 and 2 and need 2 more: taking the hits leaves 0 free blocks
    r2 = req("r2", prompt + [7, 7, 7, 7, 7])
    before = state(kv)
    assert kv.admit(r2, 10_000, now=0.0) == 0
    assert state(kv) == before
    assert r2.block_ids == [] and r2.num_computed_tokens == 0 and r2.num_registered_blocks == 0
    assert r2.last_block_hash is None
    kv.check_integrity([r1])
    # once r1 is gone, r2 gets its hits and the blocks r1 freed, least recently freed first
    kv.free(r1)
    assert kv.admit(r2, 10_000, now=0.0) == 5
    assert r2.num_computed_tokens == 8 and r2.block_ids == [1, 2, 5, 4]
    kv.check_integrity([r2])


def start_session(kv: KVCacheManager, sid: str, tokens: list[int], now: float = 0.0) -> Request:
    """A finished first turn of session ``sid``: ``tokens`` prompt + one sampled token."""
    r = req(sid, tokens, session_id=sid)
    run_prompt(kv, r)
    finish(kv, r, now=now)
    return r


def test_session_preferred_when_it_covers_more() -> None:
    kv = KVCacheManager(12, BS)
    turn1 = start_session(kv, "s", list(range(9)))  # 10 tokens, 9 computed: blocks 1, 2 keyed, 3
    assert kv.sessions.get("s").block_ids == [1, 2, 3] and turn1.block_ids == []
    kv.check_integrity([])
    prompt = turn1.all_token_ids + [20, 21, 22]
    r = req("t2", prompt, session_id="s")
    assert kv.prefix_cache.match(prompt, len(prompt) - 1) == [1, 2]  # 8 tokens; the session has 9
    assert kv.admit(r, 10_000, now=1.0) == 4
    assert r.num_computed_tokens == 9 and r.block_ids == [1, 2, 3, 4]
    assert r.num_registered_blocks == 2 and r.last_block_hash == kv.pool.key_of(2).hash
    assert "s" not in kv.sessions  # checked out by the request
    kv.check_integrity([r])
    # the turn ends: the blocks go back to the session, the partial block 4 included
    r.num_computed_tokens += 4
    kv.register_computed(r)
    r.append_output(30)
    finish(kv, r, now=2.0)
    s = kv.sessions.get("s")
    assert s.block_ids == [1, 2, 3, 4] and s.num_computed == 13 and s.token_ids == prompt + [30]
    assert [kv.pool.key_of(b) is not None for b in (1, 2, 3, 4)] == [True, True, True, False]
    kv.check_integrity([])


def test_session_preferred_on_a_tie() -> None:
    kv = KVCacheManager(12, BS)
    start_session(kv, "s", list(range(8)))  # 9 tokens, 8 computed: blocks 1, 2, both keyed
    r = req("t2", list(range(8)) + [8, 50], session_id="s")
    assert kv.sessions.reusable("s", r.all_token_ids, now=0.0) == (8, 2)
    assert kv.admit(r, 10_000, now=0.0) == 2
    assert r.block_ids == [1, 2, 3] and "s" not in kv.sessions
    kv.check_integrity([r])


def test_prefix_hits_preferred_when_they_cover_more_and_the_session_is_closed() -> None:
    kv = KVCacheManager(12, BS)
    other = req("other", list(range(12)))
    run_prompt(kv, other)  # blocks 1, 2, 3, all keyed
    assert other.block_ids == [1, 2, 3]
    kv.free(other)
    start_session(kv, "s", [0, 1, 2, 3, 4, 70, 71])  # shares 5 tokens with ``other``
    assert kv.sessions.get("s").block_ids == [1, 4]
    r = req("t2", list(range(12)) + [80], session_id="s")
    assert kv.sessions.reusable("s", r.all_token_ids, now=0.0) == (5, 2)
    assert kv.admit(r, 10_000, now=0.0) == 1
    assert r.num_computed_tokens == 12 and r.block_ids == [1, 2, 3, 5]
    assert "s" not in kv.sessions and kv.pool.ref_count(4) == 0
    kv.check_integrity([r])


def test_sessions_released_under_memory_pressure_oldest_first_never_the_one_taken() -> None:
    kv = KVCacheManager(9, BS, max_session_tokens=1000)  # 8 usable blocks
    start_session(kv, "s", [2] * 7)  # 8 tokens, 7 computed: 2 blocks each
    start_session(kv, "a", [1] * 7)
    start_session(kv, "b", [3] * 7)
    assert [s.block_ids for s in kv.sessions.all()] == [[1, 2], [3, 4], [5, 6]]
    assert kv.pool.free_queue() == [7, 8]
    # turn 2 of "s" (the oldest session) reuses its 7 tokens and needs 4 more blocks for 14 new ones
    r = req("s2", [2] * 8 + [9] * 13, session_id="s")
    assert kv.admit(r, 10_000, now=1.0) == 14
    assert r.num_computed_tokens == 7
    # "a" (the oldest but "s") is released, tail first; "b" was not needed; "s" is the request's now
    assert r.block_ids == [1, 2, 7, 8, 4, 3]
    assert [s.session_id for s in kv.sessions.all()] == ["b"]
    kv.check_integrity([r])


def test_sessions_released_for_a_request_without_a_session() -> None:
    kv = KVCacheManager(7, BS, max_session_tokens=1000)
    start_session(kv, "a", [1] * 7)
    start_session(kv, "b", [2] * 7)
    assert kv.pool.free_queue() == [5, 6]
    r = req("r", [3] * 11)
    assert kv.admit(r, 10_000, now=0.0) == 11
    assert r.block_ids == [5, 6, 2]
    assert [s.session_id for s in kv.sessions.all()] == ["b"]
    kv.check_integrity([r])


def test_admit_does_not_release_sessions_when_that_cannot_make_room() -> None:
    kv = KVCacheManager(9, BS, max_session_tokens=1000)  # 8 usable blocks
    start_session(kv, "a", [1] * 7)  # blocks 1, 2
    start_session(kv, "b", [2] * 7)  # blocks 3, 4
    x = req("x", [5] * 12)
    run_prompt(kv, x)
    assert x.block_ids == [5, 6, 7] and kv.pool.free_queue() == [8]
    # 6 blocks: 1 free + 4 pinned by sessions is not enough
    r = req("r", [3] * 24)
    before = state(kv)
    assert kv.admit(r, 10_000, now=0.0) == 0
    assert state(kv) == before  # no session was given up for nothing
    assert r.block_ids == [] and r.num_computed_tokens == 0
    kv.check_integrity([x])
    # a first chunk that fits once one session is released: only the oldest goes
    assert kv.admit(r, 8, now=0.0) == 8
    assert r.block_ids == [8, 2] and [s.session_id for s in kv.sessions.all()] == ["b"]
    kv.check_integrity([x, r])


def test_admit_counts_released_hit_blocks_once() -> None:
    kv = KVCacheManager(6, BS)
    prompt = list(range(8))
    start_session(kv, "a", prompt)  # 9 tokens, 8 computed: blocks 1, 2 keyed, pinned by "a"
    filler = req("f", [50] * 8)
    run_prompt(kv, filler, sampled=None)
    assert filler.block_ids == [3, 4] and kv.pool.free_queue() == [5]
    # a request hitting block 1 (pinned by "a") that needs 3 more blocks: releasing "a" would free
    # blocks 2 and 1, but block 1 is the hit, so only 5 and 2 are there: not enough, "a" stays
    big = req("big", prompt[:4] + [60] * 9)
    before = state(kv)
    assert kv.admit(big, 10_000, now=0.0) == 0
    assert state(kv) == before
    # r needs 2 more blocks: releasing "a" gives them (5 and 2)
    r = req("r", prompt[:4] + [60] * 5)
    assert kv.admit(r, 10_000, now=0.0) == 5
    assert r.num_computed_tokens == 4 and r.block_ids == [1, 5, 2]
    assert len(kv.sessions) == 0
    kv.check_integrity([filler, r])


def test_release_finished_pins_a_sessions_blocks_and_frees_the_rest() -> None:
    kv = KVCacheManager(12, BS)
    r = req("r", list(range(6)), session_id="s")
    run_prompt(kv, r)
    blocks = list(r.block_ids)
    assert blocks == [1, 2]
    finish(kv, r, FinishReason.LENGTH)
    assert r.block_ids == [] and kv.sessions.get("s").block_ids == blocks
    assert [kv.pool.ref_count(b) for b in blocks] == [1, 1]
    kv.check_integrity([])
    # an aborted turn gives its blocks back to the pool and keeps no session
    t2 = req("t2", r.all_token_ids + [7], session_id="s")
    run_prompt(kv, t2)
    assert t2.block_ids == [1, 2] and t2.num_computed_tokens == 8
    finish(kv, t2, FinishReason.ABORT)
    assert t2.block_ids == [] and len(kv.sessions) == 0
    assert [kv.pool.ref_count(b) for b in blocks] == [0, 0]
    # a request without a session frees its blocks too
    u = req("u", [4] * 5)
    run_prompt(kv, u)
    finish(kv, u)
    assert len(kv.sessions) == 0 and kv.pool.num_free_blocks == 11
    kv.check_integrity([])


def test_admit_counts_queried_and_reused_tokens_once() -> None:
    kv = KVCacheManager(12, BS)
    prompt = list(range(10))
    run_prompt(kv, req("r1", prompt))
    assert (kv.prefix_cache.queries, kv.prefix_cache.hits) == (10, 0)
    blocker = req("blocker", list(range(100, 140)))  # needs more blocks than are free
    assert kv.admit(blocker, 10_000, now=0.0) == 0
    assert (kv.prefix_cache.queries, kv.prefix_cache.hits) == (10, 0)
    run_prompt(kv, req("r2", prompt[:8] + [50, 51]))
    assert (kv.prefix_cache.queries, kv.prefix_cache.hits) == (20, 8)


def test_admit_copies_the_block_a_hit_ends_inside() -> None:
    kv = KVCacheManager(12, BS)
    r1 = req("r1", list(range(10)))
    run_prompt(kv, r1)
    finish(kv, r1)  # blocks 1, 2 keyed (tokens 0-7), 3 partial
    r2 = req("r2", [0, 1, 2, 3, 4, 5, 50, 51, 52])  # shares 6 tokens: block 1 and 2 rows of block 2
    assert kv.admit(r2, 10_000, now=0.0) == 3
    assert r2.num_computed_tokens == 6 and r2.block_ids[0] == 1 and len(r2.block_ids) == 3
    assert kv.pending_copies == [(2, r2.block_ids[1])] and 2 not in r2.block_ids
    assert kv.pool.ref_count(2) == 1  # the source stays out of the free queue until it is copied
    assert r2.num_registered_blocks == 1 and kv.prefix_cache.hits == 6
    kv.check_integrity([r2])
    kv.copies_done()
    assert kv.pending_copies == [] and kv.pool.ref_count(2) == 0
    kv.check_integrity([r2])
    r2.num_computed_tokens += 3
    kv.register_computed(r2)  # the copy, now full of r2's own tokens, is keyed as r2's block
    assert r2.num_registered_blocks == 2
    assert kv.pool.key_of(r2.block_ids[1]).token_ids == (4, 5, 50, 51)
    finish(kv, r2)
    kv.check_integrity([])


def test_a_finished_requests_partly_computed_block_can_be_copied() -> None:
    kv = KVCacheManager(12, BS)
    r1 = req("r1", list(range(10)))
    run_prompt(kv, r1)  # 10 computed: blocks 1, 2 keyed; 2 rows of block 3
    finish(kv, r1)
    assert kv.pool.key_of(3).token_ids == (8, 9) and kv.pool.ref_count(3) == 0
    # the next turn extends r1's prompt: all 10 tokens reused, 2 of them from a copy of block 3
    r2 = req("r2", list(range(10)) + [999, 70, 71])
    assert kv.admit(r2, 10_000, now=0.0) == 3
    assert r2.num_computed_tokens == 10 and r2.block_ids[:2] == [1, 2]
    assert kv.pending_copies == [(3, r2.block_ids[2])]
    kv.copies_done()
    kv.check_integrity([r2])
    # a failed request's rows are not offered; nor without prefix caching
    bad = req("bad", [5, 6, 7, 8, 9, 10])
    run_prompt(kv, bad)
    partial_block = bad.block_ids[1]
    bad.error = "boom"
    finish(kv, bad, FinishReason.ERROR)
    assert kv.pool.key_of(partial_block) is None
    off = KVCacheManager(12, BS, enable_prefix_caching=False)
    r3 = req("r3", list(range(10)))
    run_prompt(off, r3)
    finish(off, r3)
    assert all(off.pool.key_of(b) is None for b in range(12))
