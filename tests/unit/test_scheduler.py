"""Scheduler: token budget, chunked prefill, admission limits, preemption, queue limits, n > 1
siblings and block accounting, with the engine's update step simulated (no model, no tensors)."""

from __future__ import annotations

import random

import pytest

from swiftlm.cache.kv_manager import KVCacheManager
from swiftlm.config import SchedulerConfig
from swiftlm.core.request import FinishReason, Request, RequestStatus
from swiftlm.engine.scheduler import QueueFullError, Scheduler, SchedulerOutput
from swiftlm.sampling import SamplingParams

BS = 4


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Harness:
    """A Scheduler, its KVCacheManager and a fake clock, with the engine's update step.

    Instead of KV tensors it keeps a shadow cache: each slot ``(block, offset)`` holds the token
    history whose KV the model would have written there. After every step, each running request's
    and each session's computed positions must hold exactly their own history, so a wrong prefix
    hit, a reused block overwritten by another request, or a lost pinned block all show up.
    """

    def __init__(self, num_blocks: int = 64, max_session_tokens: int | None = None, **sched: object) -> None:
        self.clock = Clock()
        self.kv = KVCacheManager(num_blocks, BS, session_ttl=100.0, max_session_tokens=max_session_tokens)
        self.sched = Scheduler(SchedulerConfig(**sched), self.kv, clock=self.clock)
        self.finished: list[Request] = []
        self.slots: dict[tuple[int, int], tuple[int, ...]] = {}
        self.last = SchedulerOutput()  # the latest schedule() result

    def add(
        self,
        rid: str,
        prompt: list[int],
        max_tokens: int = 4,
        session_id: str | None = None,
        wait_for: Request | None = None,
        arrival: float | None = None,
        **fields: object,
    ) -> Request:
        """Add a request arriving now (or at ``arrival``); ``fields``: more of Request's fields."""
        r = Request(
            request_id=rid,
            prompt_token_ids=list(prompt),
            sampling_params=SamplingParams(max_tokens=max_tokens),
            arrival_time=self.clock.now if arrival is None else arrival,
            session_id=session_id,
            wait_for=wait_for,
            **fields,
        )
        self.sched.add_request(r)
        return r

    def step(self) -> list[tuple[str, int, bool]]:
        """schedule() + the engine's update; returns (request id, new tokens, samples) per request."""
        out = self.sched.schedule()
        for src, dst in self.kv.pending_copies:  # as the engine copies a block a hit ends inside
            for off in range(BS):
                if (src, off) in self.slots:
                    self.slots[(dst, off)] = self.slots[(src, off)]
                else:
                    self.slots.pop((dst, off), None)
        self.kv.copies_done()
        plan = [(s.request.request_id, s.num_new_tokens, s.samples) for s in out.scheduled]
        for s in out.scheduled:
            r = s.request
            assert len(r.block_ids) * BS >= r.num_computed_tokens + s.num_new_tokens
            self.check_kv(r.block_ids, r.all_token_ids, r.num_computed_tokens)
        written: set[tuple[int, int]] = set()
        for s in out.scheduled:
            r = s.request
            for pos in range(r.num_computed_tokens, r.num_computed_tokens + s.num_new_tokens):
                slot = (r.block_ids[pos // BS], pos % BS)
                assert slot[0] != 0 and slot not in written, f"{r.request_id} writes slot {slot} twice"
                written.add(slot)
                self.slots[slot] = tuple(r.all_token_ids[: pos + 1])
        for s in out.scheduled:
            r, samples = s.request, s.samples
            r.num_computed_tokens += s.num_new_tokens
            self.kv.register_computed(r)
            if samples:
                r.append_output(1000 + r.num_output_tokens)
                if r.num_output_tokens >= r.sampling_params.max_tokens:
                    self.sched.finish(r, FinishReason.STOP)
                    self.finished.append(r)
        self.check()
        self.last = out
        return plan

    def run(self, max_steps: int = 200) -> int:
        for n in range(max_steps):
            if not self.sched.num_unfinished:
                return n
            self.step()
        raise AssertionError("requests did not finish")

    def check(self) -> None:
        self.kv.check_integrity(self.sched.running + list(self.sched.waiting))
        for r in self.sched.running:
            self.check_kv(r.block_ids, r.all_token_ids, r.num_computed_tokens)
        for session in self.kv.sessions.all():
            self.check_kv(session.block_ids, session.token_ids, session.num_computed)

    def check_kv(self, block_ids: list[int], token_ids: list[int], num_computed: int) -> None:
        for pos in range(num_computed):
            slot = (block_ids[pos // BS], pos % BS)
            assert self.slots.get(slot) == tuple(token_ids[: pos + 1]), f"slot {slot} holds another history"

    def assert_no_leaks(self) -> None:
        """Every block is free except those pinned by sessions; cached blocks wait in the free queue."""
        pool = self.kv.pool
        pinned = self.kv.sessions.pinned_blocks()
        free = pool.free_queue()
        assert sorted(free) == sorted(set(range(1, pool.num_blocks)) - pinned)
        assert all(pool.ref_count(b) == 0 for b in free)
        assert all(pool.key_of(b) is None or b in free or b in pinned for b in range(1, pool.num_blocks))
        self.kv.check_integrity([])


def prompt(n: int, base: int = 0) -> list[int]:
    return [base + i for i in range(n)]


def test_decodes_go_before_prefill_chunks_and_fill_the_budget() -> None:
    h = Harness(max_num_batched_tokens=8)
    a = h.add("a", prompt(6), max_tokens=10)
    b = h.add("b", prompt(20, 100), max_tokens=2)
    assert h.step() == [("a", 6, True), ("b", 2, False)]
    assert h.step() == [("a", 1, True), ("b", 7, False)]
    # a later-admitted decode goes before an earlier-admitted prefill too
    h.sched.running.reverse()
    assert [r.request_id for r in h.sched.running] == ["b", "a"]
    assert h.step() == [("a", 1, True), ("b", 7, False)]
    c = h.add("c", prompt(3, 200), max_tokens=1)
    assert h.step() == [("a", 1, True), ("b", 4, True), ("c", 3, True)]
    assert c.is_finished and b.num_output_tokens == 1
    assert h.step() == [("b", 1, True), ("a", 1, True)]  # two decodes: in running order
    assert b.is_finished
    h.run()
    assert a.num_output_tokens == 10
    h.assert_no_leaks()


def test_chunked_prefill_uses_chunks_of_the_budget_and_samples_on_the_last() -> None:
    h = Harness(max_num_batched_tokens=7)
    r = h.add("r", prompt(21), max_tokens=3)
    assert h.step() == [("r", 7, False)]
    assert r.num_computed_tokens == 7 and r.block_ids == [1, 2] and r.num_registered_blocks == 1
    assert r.num_output_tokens == 0
    assert h.step() == [("r", 7, False)]
    assert r.num_computed_tokens == 14 and r.block_ids == [1, 2, 3, 4] and r.num_registered_blocks == 3
    assert h.step() == [("r", 7, True)]
    assert r.num_computed_tokens == 21 and r.block_ids == [1, 2, 3, 4, 5, 6] and r.num_registered_blocks == 5
    assert r.output_token_ids == [1000]
    assert h.step() == [("r", 1, True)]
    assert h.step() == [("r", 1, True)]
    assert r.is_finished and r.output_token_ids == [1000, 1001, 1002]
    h.assert_no_leaks()


def test_max_num_seqs_is_respected() -> None:
    h = Harness(max_num_seqs=2, max_num_batched_tokens=100)
    a = h.add("a", prompt(3), max_tokens=2)
    h.add("b", prompt(3, 10), max_tokens=3)
    h.add("c", prompt(3, 20), max_tokens=1)
    assert h.step() == [("a", 3, True), ("b", 3, True)]
    assert [r.request_id for r in h.sched.waiting] == ["c"]
    assert h.step() == [("a", 1, True), ("b", 1, True)]  # c still waits: 2 sequences run
    assert a.is_finished
    assert h.step() == [("b", 1, True), ("c", 3, True)]
    assert h.sched.num_unfinished == 0
    h.assert_no_leaks()


def test_preemption_frees_the_most_recent_unscheduled_request_which_later_completes() -> None:
    h = Harness(num_blocks=7, max_num_batched_tokens=100)  # 6 usable blocks
    a = h.add("a", prompt(3, 10), max_tokens=8)
    b = h.add("b", prompt(3, 20), max_tokens=8)
    c = h.add("c", prompt(3, 30), max_tokens=8)
    assert h.step() == [("a", 3, True), ("b", 3, True), ("c", 3, True)]
    assert (a.block_ids, b.block_ids, c.block_ids) == ([1], [2], [3])
    for _ in range(5):
        assert h.step() == [("a", 1, True), ("b", 1, True), ("c", 1, True)]
    assert (a.block_ids, b.block_ids, c.block_ids) == ([1, 4], [2, 5], [3, 6])
    assert a.num_computed_tokens == 8 and h.kv.pool.num_free_blocks == 0
    # a needs a third block: c (admitted last, not yet scheduled) is preempted, tail first (6, 3);
    # a takes 6, then b needs one too and takes 3
    assert h.step() == [("a", 1, True), ("b", 1, True)]
    assert h.last.preempted == [c]
    assert c.status is RequestStatus.WAITING and list(h.sched.waiting) == [c]
    assert c.block_ids == [] and c.num_computed_tokens == 0 and c.num_output_tokens == 6
    assert c.metrics.num_preemptions == 1 and h.sched.num_preemptions == 1
    assert a.block_ids == [1, 4, 6] and b.block_ids == [2, 5, 3]
    assert h.kv.pool.key_of(3) is None  # c's cached first block was handed to b
    # nothing is admitted while blocks are short
    assert h.step() == [("a", 1, True), ("b", 1, True)]
    assert a.is_finished and b.is_finished
    assert h.kv.pool.free_queue() == [6, 4, 1, 3, 5, 2]
    # c recomputes its prompt and its 6 outputs (its cached block was lost), then samples
    assert h.step() == [("c", 9, True)]
    assert c.block_ids == [6, 4, 1] and c.num_computed_tokens == 9 and c.num_cached_tokens == 0
    assert h.step() == [("c", 1, True)]
    assert c.is_finished and c.output_token_ids == [1000 + i for i in range(8)]
    h.assert_no_leaks()


def test_preempted_request_reuses_its_cached_blocks() -> None:
    h = Harness(num_blocks=5, max_num_batched_tokens=100)  # 4 usable blocks
    a = h.add("a", prompt(4, 10), max_tokens=7)
    b = h.add("b", prompt(4, 20), max_tokens=7)
    assert h.step() == [("a", 4, True), ("b", 4, True)]
    assert (a.block_ids, b.block_ids) == ([1], [2])
    for _ in range(4):
        h.step()
    assert (a.block_ids, b.block_ids) == ([1, 3], [2, 4]) and a.num_computed_tokens == 8
    # a needs a third block: b is preempted and frees blocks 4 and 2 (both full and cached)
    assert h.step() == [("a", 1, True)]
    assert h.last.preempted == [b] and a.block_ids == [1, 3, 4]
    assert h.kv.pool.free_queue() == [2]
    assert h.step() == [("a", 1, True)]  # b: 1 hit (block 2) but it needs 2 more blocks: it waits
    assert a.is_finished and h.kv.pool.free_queue() == [2, 4, 3, 1]
    # b hits its first block, recomputes the rest
    assert h.step() == [("b", 5, True)]
    assert b.block_ids == [2, 4, 3] and b.num_computed_tokens == 9 and b.num_cached_tokens == 0
    h.run()
    assert b.output_token_ids == [1000 + i for i in range(7)]
    h.assert_no_leaks()


def test_the_request_itself_is_preempted_when_it_is_the_most_recent() -> None:
    h = Harness(num_blocks=4, max_num_batched_tokens=100)  # 3 usable blocks
    a = h.add("a", prompt(4, 10), max_tokens=4)
    b = h.add("b", prompt(4, 20), max_tokens=6)
    h.step()
    assert (a.block_ids, b.block_ids) == ([1], [2])
    # a takes block 3; b finds none left and is itself the most recent: it gives way
    assert h.step() == [("a", 1, True)]
    assert a.block_ids == [1, 3] and b.block_ids == [] and h.last.preempted == [b]
    h.run()
    assert a.is_finished and b.is_finished and b.num_output_tokens == 6
    assert h.sched.num_preemptions == 1
    h.assert_no_leaks()


def test_queue_full_error_when_waiting_is_at_max_queued_requests() -> None:
    h = Harness(max_queued_requests=2, max_num_seqs=1)
    h.add("a", prompt(3))
    h.add("b", prompt(3, 10))
    with pytest.raises(QueueFullError, match="max_queued_requests=2"):
        h.add("c", prompt(3, 20))
    assert [r.request_id for r in h.sched.waiting] == ["a", "b"]
    h.step()  # a runs: one place is free again
    h.add("c", prompt(3, 20))
    with pytest.raises(QueueFullError):
        h.add("d", prompt(3, 30))
    h.run()
    h.assert_no_leaks()


def test_max_queue_wait_expires_never_scheduled_requests() -> None:
    h = Harness(max_num_seqs=1, max_queue_wait=5.0, max_num_batched_tokens=100)
    a = h.add("a", prompt(3), max_tokens=100)
    assert h.step() == [("a", 3, True)]
    b = h.add("b", prompt(3, 10))
    h.clock.now = 3.0
    c = h.add("c", prompt(3, 20))
    h.clock.now = 5.0
    assert h.step() == [("a", 1, True)]
    assert h.last.timed_out == []
    h.clock.now = 5.5
    assert h.step() == [("a", 1, True)]
    assert h.last.timed_out == [b]
    assert b.is_finished and b.finish_reason is FinishReason.ERROR and "max_queue_wait=5.0" in b.error
    assert list(h.sched.waiting) == [c]
    h.clock.now = 8.5
    h.step()
    assert h.last.timed_out == [c] and not h.sched.waiting
    # a request that was scheduled once (then preempted) never times out in the queue
    assert a.num_tokens == 7
    h.sched._preempt(a, h.last)
    h.clock.now = 100.0
    assert h.step() == [("a", 3, True)]  # its first block is still cached
    assert h.last.timed_out == [] and a.metrics.num_preemptions == 1
    h.sched.finish(a, FinishReason.ABORT)
    h.assert_no_leaks()


def test_n_siblings_wait_for_the_first_prompt_then_hit_its_blocks() -> None:
    h = Harness(max_num_batched_tokens=16)
    p = prompt(10)
    first = h.add("x-0", p, max_tokens=3)
    second = h.add("x-1", p, max_tokens=3, wait_for=first)
    other = h.add("y", prompt(3, 50), max_tokens=1)
    # the sibling is skipped (the prompt is not computed yet); the next request is not held up
    assert h.step() == [("x-0", 10, True), ("y", 3, True)]
    assert [r.request_id for r in h.sched.waiting] == ["x-1"] and other.is_finished
    assert h.step() == [("x-0", 1, True), ("x-1", 2, True)]
    assert second.num_cached_tokens == 8 and second.block_ids == [1, 2, 5]
    assert first.block_ids == [1, 2, 3]
    assert [h.kv.pool.ref_count(b) for b in (1, 2, 3, 5)] == [2, 2, 1, 1]
    h.run()
    assert first.output_token_ids == second.output_token_ids == [1000, 1001, 1002]
    h.assert_no_leaks()


def test_n_sibling_waits_through_a_chunked_prompt() -> None:
    h = Harness(max_num_batched_tokens=6)
    p = prompt(13)
    first = h.add("x-0", p, max_tokens=2)
    second = h.add("x-1", p, max_tokens=2, wait_for=first)
    assert h.step() == [("x-0", 6, False)]
    assert not second.ready_to_share()
    assert h.step() == [("x-0", 6, False)]
    assert second.ready_to_share()  # 12 of 13: the last prompt token is computed by each anyway
    assert h.step() == [("x-0", 1, True), ("x-1", 1, True)]  # 12 of 13 cached: 3 hit blocks
    assert second.num_cached_tokens == 12 and second.block_ids == [1, 2, 3, 5]
    h.run()
    h.assert_no_leaks()


def test_finish_of_waiting_and_running_requests_frees_everything() -> None:
    h = Harness(max_num_batched_tokens=8, max_num_seqs=2)
    a = h.add("a", prompt(20), max_tokens=5)  # mid-prefill after one step
    b = h.add("b", prompt(3, 30), max_tokens=5)
    c = h.add("c", prompt(3, 40), max_tokens=5)
    assert h.step() == [("a", 8, False)]
    assert a.block_ids == [1, 2]
    h.sched.finish(a, FinishReason.ABORT)
    assert a.is_finished and a.block_ids == [] and a.finish_reason is FinishReason.ABORT
    h.sched.finish(a, FinishReason.STOP)  # a second finish changes nothing
    assert a.finish_reason is FinishReason.ABORT
    h.sched.finish(c, FinishReason.ABORT)  # still waiting
    assert c.is_finished and list(h.sched.waiting) == [b]
    h.check()
    assert h.step() == [("b", 3, True)]
    h.sched.finish(b, FinishReason.ABORT)  # mid-decode
    assert h.sched.num_unfinished == 0
    assert h.kv.pool.free_queue()[-3:] == [2, 1, 3]  # a's, tail first (block 1 still cached), b's
    assert h.kv.pool.key_of(1) is not None
    h.assert_no_leaks()


def test_sessions_across_turns_through_the_scheduler() -> None:
    h = Harness(max_num_batched_tokens=100)
    t1 = h.add("t1", prompt(10), max_tokens=3, session_id="s")
    h.run()
    s = h.kv.sessions.get("s")
    assert s.token_ids == t1.all_token_ids and s.num_computed == 12 and s.block_ids == [1, 2, 3]
    t2 = h.add("t2", t1.all_token_ids + [7, 8, 9], max_tokens=2, session_id="s")
    assert h.step() == [("t2", 4, True)]
    assert t2.num_cached_tokens == 12 and t2.block_ids == [1, 2, 3, 4]
    h.run()
    assert h.kv.sessions.get("s").block_ids == [1, 2, 3, 4, 5] and t2.num_computed_tokens == 17
    h.assert_no_leaks()


def test_an_edited_conversation_leaves_the_cached_history_intact() -> None:
    h = Harness(max_num_batched_tokens=100)
    t1 = h.add("t1", prompt(6), max_tokens=3, session_id="s")
    h.run()
    assert h.kv.sessions.get("s").block_ids == [1, 2] and h.kv.pool.key_of(2) is not None
    # the next turn diverges at token 6, inside the cached block 2: block 1 is reused, and block 2's
    # first two rows through a copy of it (block 3), whose last two rows t2 then writes
    t2 = h.add("t2", t1.all_token_ids[:6] + [77, 78], max_tokens=2, session_id="s")
    assert h.step() == [("t2", 2, True)]
    assert t2.num_cached_tokens == 6 and t2.block_ids == [1, 3]
    # the old history still hits blocks 1 and 2, which hold its KV (the shadow cache checks)
    t3 = h.add("t3", t1.all_token_ids[:8] + [5], max_tokens=1)
    assert h.step() == [("t2", 1, True), ("t3", 1, True)]
    assert t3.num_cached_tokens == 8 and t2.is_finished and t3.is_finished
    h.assert_no_leaks()


def test_no_leaks_after_aborts_mid_prefill_and_mid_decode() -> None:
    h = Harness(num_blocks=20, max_num_batched_tokens=10, max_num_seqs=4)
    shared = prompt(8, 500)
    rs = [
        h.add("long", prompt(30), max_tokens=4),
        h.add("p1", shared + [1, 2, 3], max_tokens=6),
        h.add("p2", shared + [4, 5], max_tokens=6, session_id="s1"),
        h.add("d", prompt(2, 900), max_tokens=50),
        h.add("p3", shared + [6], max_tokens=3, session_id="s2"),
    ]
    for _ in range(2):
        h.step()
    long, d = rs[0], rs[3]
    assert long.is_prefilling and long.num_computed_tokens > 0
    h.sched.finish(long, FinishReason.ABORT)
    for _ in range(4):
        h.step()
    assert d.status is RequestStatus.RUNNING and not d.is_prefilling and d.num_output_tokens > 0
    h.sched.finish(d, FinishReason.ABORT)
    h.run()
    assert all(r.is_finished for r in rs)
    assert sorted(s.session_id for s in h.kv.sessions.all()) == ["s1", "s2"]
    assert h.kv.pool.key_of(1) is not None
    h.assert_no_leaks()
    for sid in ("s1", "s2"):
        h.kv.sessions.close(sid)
    assert h.kv.pool.num_free_blocks == h.kv.pool.num_usable_blocks
    h.assert_no_leaks()


@pytest.mark.parametrize("seed", range(50))
def test_random_workload_keeps_every_block_accounted_for(seed: int) -> None:
    """Arrivals, shared prefixes, sessions, aborts and preemption on a small pool."""
    rng = random.Random(seed)
    h = Harness(
        num_blocks=10, max_num_batched_tokens=rng.choice([3, 7, 16]), max_num_seqs=4, max_session_tokens=16
    )
    prefixes = [prompt(rng.randint(1, 9), 1000 * k) for k in range(3)]
    live: list[Request] = []
    for i in range(80):
        h.clock.now += 1.0
        if len(h.sched.waiting) < 4 and rng.random() < 0.5:
            sid = rng.choice([None, None, "s1", "s2"])
            s = h.kv.sessions.get(sid) if sid else None
            base = rng.choice(prefixes)
            if s is not None and rng.random() < 0.7:  # the next turn, or a conversation edited back
                base = s.token_ids if rng.random() < 0.5 else s.token_ids[: rng.randint(1, len(s.token_ids))]
            elif rng.random() < 0.3 and h.finished:  # a request seen before, maybe cut short
                seen = rng.choice(h.finished).all_token_ids
                base = seen[: rng.randint(1, len(seen))]
            p = (base + prompt(rng.randint(1, 6), 100 * i))[:20]  # at most 20 + 12 tokens: 8 blocks
            live.append(h.add(f"r{i}", p, max_tokens=rng.randint(1, 12), session_id=sid))
        if live and rng.random() < 0.1:
            h.sched.finish(live.pop(rng.randrange(len(live))), FinishReason.ABORT)
        h.step()
        live = [r for r in live if not r.is_finished]
    h.run(max_steps=500)
    assert all(r.is_finished for r in live)
    h.assert_no_leaks()


@pytest.mark.parametrize("seed", range(6))
def test_decode_steps_schedule_as_the_general_loop_does(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Scheduler._schedule_decodes`` (steps of decodes alone) makes the general loop's choices:
    the same plans, preemptions and blocks over a workload that runs short of blocks."""

    def run() -> list[object]:
        rng = random.Random(seed)
        h = Harness(num_blocks=9, max_num_batched_tokens=rng.choice([4, 16, 64]), max_num_seqs=5)
        trace: list[object] = []
        for i in range(60):
            h.clock.now += 1.0
            if len(h.sched.waiting) < 3 and rng.random() < 0.4:
                h.add(f"r{i}", prompt(rng.randint(1, 9), 100 * i), max_tokens=rng.randint(1, 14))
            trace.append((h.step(), [r.request_id for r in h.last.preempted],
                          [(r.request_id, list(r.block_ids)) for r in h.sched.running]))
        h.run(max_steps=500)
        h.assert_no_leaks()
        return trace

    fast = run()
    calls = []

    def general(self: Scheduler, decodes: list[Request], budget, out: SchedulerOutput) -> None:
        calls.append(len(decodes))
        self._schedule_in_order(decodes, len(decodes), budget, out)

    monkeypatch.setattr(Scheduler, "_schedule_decodes", general)
    assert run() == fast
    assert calls and any(t[1] for t in fast), "decode-only steps ran, and some preempted"
