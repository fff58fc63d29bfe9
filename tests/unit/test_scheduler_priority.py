"""The "priority" scheduling policy and background (Batch API) requests, with the engine's update
step simulated by the scheduler tests' harness (no model, no tensors)."""

from __future__ import annotations

from pathlib import Path

import pytest

from swiftlm.config import ConfigError, SchedulerConfig
from swiftlm.core.generation import GenerationRequest
from swiftlm.core.request import FinishReason, RequestStatus
from swiftlm.engine.scheduler import QueueFullError
from swiftlm.sampling import SamplingParams
from tests.unit.test_scheduler import Harness, prompt

# The shares these tests were written with, and no busy-time limits (tested on their own below)
_PLAIN = {"background_max_tokens_share": 0.5, "background_busy_tokens": 10**6, "background_busy_prefill_every": 1,
          "background_busy_linger_s": 0.0}


class PHarness(Harness):
    """The scheduler harness with each request's priority, background flag and arrival time;
    the busy-time limits are off unless a test sets them."""

    def __init__(self, num_blocks: int = 64, **sched: object) -> None:
        super().__init__(num_blocks, **{**_PLAIN, **sched})

    def check(self) -> None:
        super().check()
        assert all(r.block_ids == [] for r in self.sched.background_waiting)
        assert all(r.background for r in self.sched.background_waiting)
        assert not any(r.background for r in self.sched.waiting)

    def admission_order(self) -> list[str]:
        order: list[str] = []
        for _ in range(200):
            if not self.sched.num_unfinished:
                return order
            for rid, _, _ in self.step():
                if rid not in order:
                    order.append(rid)
        raise AssertionError("requests did not finish")

    def step_until_preemption(self, max_steps: int = 50) -> list[tuple[str, int, bool]]:
        for _ in range(max_steps):
            plan = self.step()
            if self.last.preempted:
                return plan
        raise AssertionError("no preemption")


def ids(requests) -> list[str]:
    return [r.request_id for r in requests]


# -- the "priority" policy -----------------------------------------------------------------------


def test_priority_admits_by_priority_then_arrival() -> None:
    h = PHarness(max_num_seqs=1, max_num_batched_tokens=100, scheduling_policy="priority")
    h.add("first", prompt(3), max_tokens=2, priority=9)  # alone: it runs at once
    assert h.step() == [("first", 3, True)]
    h.clock.now = 1.0
    h.add("p5", prompt(3, 10), priority=5)
    h.add("p1-late", prompt(3, 20), priority=1, arrival=3.0)
    h.add("p1-early", prompt(3, 30), priority=1, arrival=2.0)  # added later, arrived earlier
    h.add("neg", prompt(3, 40), priority=-1)
    h.add("p1-tie", prompt(3, 50), priority=1, arrival=3.0)  # same key as p1-late: added after it
    assert ids(h.sched.waiting) == ["neg", "p1-early", "p1-late", "p1-tie", "p5"]
    assert h.admission_order() == ["first", "neg", "p1-early", "p1-late", "p1-tie", "p5"]
    h.assert_no_leaks()


def test_fcfs_ignores_priority() -> None:
    h = PHarness(max_num_seqs=1, max_num_batched_tokens=100)
    h.add("a", prompt(3), priority=5)
    h.add("b", prompt(3, 10), priority=-3, arrival=-1.0)
    h.add("c", prompt(3, 20), priority=0)
    assert ids(h.sched.waiting) == ["a", "b", "c"]
    assert h.admission_order() == ["a", "b", "c"]
    h.assert_no_leaks()


@pytest.mark.parametrize(("policy", "victim"), [("fcfs", "c"), ("priority", "b")])
def test_preemption_victim_is_the_least_important_under_priority(policy: str, victim: str) -> None:
    h = PHarness(num_blocks=7, max_num_batched_tokens=100, scheduling_policy=policy)  # 6 usable blocks
    a = h.add("a", prompt(3, 10), max_tokens=8, priority=1)
    b = h.add("b", prompt(3, 20), max_tokens=8, priority=2)
    assert h.step() == [("a", 3, True), ("b", 3, True)]
    c = h.add("c", prompt(3, 30), max_tokens=8, priority=0)  # admitted last, the most important
    assert h.step() == [("a", 1, True), ("b", 1, True), ("c", 3, True)]
    assert ids(h.sched.running) == ["a", "b", "c"]
    # a needs a block first: "fcfs" frees the latest admitted (c), "priority" the largest priority (b)
    plan = h.step_until_preemption()
    assert ids(h.last.preempted) == [victim]
    assert plan[0][0] == "a" and victim not in [rid for rid, _, _ in plan]
    assert ids(h.sched.waiting) == [victim]
    h.run()
    assert all(r.is_finished and r.num_output_tokens == 8 for r in (a, b, c))
    h.assert_no_leaks()


def test_priority_preempted_request_goes_back_before_its_equals() -> None:
    h = PHarness(num_blocks=4, max_num_batched_tokens=100, scheduling_policy="priority")  # 3 usable
    a = h.add("a", prompt(4, 10), max_tokens=4, priority=0)
    b = h.add("b", prompt(4, 20), max_tokens=6, priority=1)
    h.step()
    h.add("late", prompt(3, 30), priority=1)  # same priority, later arrival
    h.add("urgent", prompt(3, 40), priority=0, arrival=5.0)
    # a takes block 3; b finds none left and is itself the least important: it gives way
    assert h.step() == [("a", 1, True)]
    assert h.last.preempted == [b]
    assert ids(h.sched.waiting) == ["urgent", "b", "late"]
    h.run()
    assert a.is_finished and b.num_output_tokens == 6
    h.assert_no_leaks()


# -- background requests ---------------------------------------------------------------------------


def test_background_waits_while_interactive_requests_wait() -> None:
    h = PHarness(max_num_seqs=2, max_num_batched_tokens=100)
    bg = h.add("bg", prompt(3), max_tokens=2, background=True)
    h.add("i1", prompt(3, 10), max_tokens=1)
    h.add("i2", prompt(3, 20), max_tokens=3)
    h.add("i3", prompt(3, 30), max_tokens=3)
    assert ids(h.sched.waiting) == ["i1", "i2", "i3"] and ids(h.sched.background_waiting) == ["bg"]
    assert h.sched.num_unfinished == 4 and h.sched.num_background_waiting == 1
    assert h.step() == [("i1", 3, True), ("i2", 3, True)]
    # i3 takes i1's seat; nothing interactive waits then, but no seat is left
    assert h.step() == [("i2", 1, True), ("i3", 3, True)]
    assert h.step() == [("i2", 1, True), ("i3", 1, True)]
    assert h.step() == [("i3", 1, True), ("bg", 3, True)]
    assert h.sched.num_background_running == 1 and h.sched.num_background_waiting == 0
    h.run()
    assert bg.num_output_tokens == 2
    h.assert_no_leaks()


def test_background_is_admitted_after_interactive_in_the_same_step() -> None:
    h = PHarness(max_num_seqs=4, max_num_batched_tokens=100)
    h.add("bg", prompt(3), background=True)
    h.add("i", prompt(3, 10))
    assert h.step() == [("i", 3, True), ("bg", 3, True)]
    h.run()
    h.assert_no_leaks()


def test_running_background_requests_go_after_running_interactive_ones() -> None:
    h = PHarness(max_num_seqs=4, max_num_batched_tokens=8)
    h.add("i", prompt(12))
    h.add("bg", prompt(3, 100), background=True)
    assert h.step() == [("i", 8, False)]  # no budget left to admit bg
    assert h.step() == [("i", 4, True), ("bg", 3, True)]
    h.add("j", prompt(20, 200))
    # running requests go before admitted ones; then interactive decodes, prefills, background
    assert h.step() == [("i", 1, True), ("bg", 1, True), ("j", 6, False)]
    # interactive work first: it may leave background requests nothing this step
    assert h.step() == [("i", 1, True), ("j", 7, False)]
    assert h.step() == [("i", 1, True), ("j", 7, True)]
    assert h.step() == [("j", 1, True), ("bg", 1, True)]  # i has finished
    h.run()
    h.assert_no_leaks()


def test_background_seat_cap() -> None:
    assert SchedulerConfig(max_num_seqs=4).max_background_seqs == 2
    assert SchedulerConfig(max_num_seqs=4, background_max_seqs_share=0.1).max_background_seqs == 1
    assert SchedulerConfig(max_num_seqs=5, background_max_seqs_share=1.0).max_background_seqs == 5
    h = PHarness(max_num_seqs=4, max_num_batched_tokens=100)
    for k in range(4):
        h.add(f"bg{k}", prompt(3, 10 * k), max_tokens=3, background=True)
    assert h.step() == [("bg0", 3, True), ("bg1", 3, True)]
    assert h.sched.num_background_running == 2 and h.sched.num_background_waiting == 2
    h.add("i", prompt(3, 100), max_tokens=1)  # interactive requests may take the other seats
    assert h.step() == [("bg0", 1, True), ("bg1", 1, True), ("i", 3, True)]
    assert h.step() == [("bg0", 1, True), ("bg1", 1, True)]  # bg0 and bg1 finish
    assert h.step() == [("bg2", 3, True), ("bg3", 3, True)]
    h.run()
    h.assert_no_leaks()


def test_background_token_cap_per_step_and_per_prefill_chunk() -> None:
    assert SchedulerConfig(max_num_batched_tokens=8, background_max_tokens_share=0.5).max_background_tokens == 4
    h = PHarness(max_num_seqs=4, max_num_batched_tokens=8)
    bg1 = h.add("bg1", prompt(3), max_tokens=10, background=True)
    bg2 = h.add("bg2", prompt(10, 100), max_tokens=2, background=True)
    # 4 background tokens a step, decodes and prefill chunks of running and admitted requests alike
    assert h.step() == [("bg1", 3, True), ("bg2", 1, False)]
    assert h.step() == [("bg1", 1, True), ("bg2", 3, False)]
    i = h.add("i", prompt(6, 200), max_tokens=3)
    assert h.step() == [("bg1", 1, True), ("bg2", 3, False), ("i", 4, False)]
    # interactive work goes first and is never cut short by background work
    assert h.step() == [("i", 2, True), ("bg1", 1, True), ("bg2", 3, True)]
    assert bg2.num_computed_tokens == 10
    assert h.step() == [("i", 1, True), ("bg1", 1, True), ("bg2", 1, True)]
    h.run()
    assert i.is_finished and bg1.num_output_tokens == 10
    h.assert_no_leaks()


def test_a_long_background_prefill_never_holds_up_interactive_decodes() -> None:
    h = PHarness(max_num_seqs=4, max_num_batched_tokens=8, background_max_tokens_share=0.01)
    assert h.sched.config.max_background_tokens == 1  # at least one token
    i = h.add("i", prompt(2), max_tokens=5)
    bg = h.add("bg", prompt(40, 100), max_tokens=1, background=True)
    assert h.step() == [("i", 2, True), ("bg", 1, False)]
    for _ in range(4):
        assert h.step() == [("i", 1, True), ("bg", 1, False)]
    assert i.is_finished and bg.num_computed_tokens == 5
    h.run()
    assert bg.is_finished
    h.assert_no_leaks()


def test_background_share_shrinks_while_interactive_requests_run() -> None:
    """background_busy_tokens a step while an interactive request runs or waits, and for the
    linger time after; the full share again once none has for that long."""
    h = PHarness(max_num_seqs=8, max_num_batched_tokens=64, background_busy_tokens=2, background_busy_linger_s=1.0)
    bg = h.add("bg", prompt(20, 100), max_tokens=2, background=True)
    assert h.step() == [("bg", 20, True)]  # alone: its 32-token share holds the whole prompt
    h.run()
    bg2 = h.add("bg2", prompt(20, 300), max_tokens=2, background=True)
    i = h.add("i", prompt(3), max_tokens=4)
    # the interactive request is admitted first; the background one after it, 2 tokens a step
    assert h.step() == [("i", 3, True), ("bg2", 2, False)]
    assert h.step() == [("i", 1, True), ("bg2", 2, False)]
    while not i.is_finished:
        plan = h.step()
        assert sum(n for rid, n, _ in plan if rid == "bg2") <= 2
    assert h.step() == [("bg2", 2, False)]  # within the linger time after the last interactive request
    h.clock.now += 1.5
    remaining = 20 - bg2.num_computed_tokens
    assert remaining > 2
    assert h.step()[0][:2] == ("bg2", remaining)  # no interactive request for a while: the full share again
    h.run()
    assert bg.is_finished and bg2.is_finished
    h.assert_no_leaks()


def test_busy_background_prefill_only_every_nth_step_decodes_every_step() -> None:
    h = PHarness(max_num_seqs=8, max_num_batched_tokens=64, background_busy_tokens=4, background_busy_prefill_every=3)
    dec = h.add("dec", prompt(2, 500), max_tokens=30, background=True)
    h.step()  # alone: prefilled whole
    i = h.add("i", prompt(2), max_tokens=20)
    pre = h.add("pre", prompt(30, 100), max_tokens=2, background=True)
    plans = [h.step() for _ in range(9)]
    for plan in plans:
        assert ("i", 2, True) in plan or ("i", 1, True) in plan  # the interactive request every step
        assert any(rid == "dec" and n == 1 for rid, n, _ in plan)  # the background decode every step
    chunks = [n for plan in plans for rid, n, _ in plan if rid == "pre"]
    assert len(chunks) == 3 and all(n <= 3 for n in chunks)  # one chunk every third step, within the cap
    assert not i.is_finished and dec.num_output_tokens >= 9 and pre.num_computed_tokens == sum(chunks)
    h.run()
    h.assert_no_leaks()


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_background_requests_are_preempted_before_interactive_ones(policy: str) -> None:
    h = PHarness(num_blocks=7, max_num_batched_tokens=100, scheduling_policy=policy)  # 6 usable blocks
    bg = h.add("bg", prompt(2), max_tokens=10, priority=-10, background=True)
    assert h.step() == [("bg", 2, True)]
    i1 = h.add("i1", prompt(3, 10), max_tokens=7)
    i2 = h.add("i2", prompt(3, 20), max_tokens=7)
    assert h.step() == [("bg", 1, True), ("i1", 3, True), ("i2", 3, True)]
    assert h.step() == [("i1", 1, True), ("i2", 1, True), ("bg", 1, True)]
    # i1 needs a block first: bg goes, though it was admitted first and is the most important
    plan = h.step_until_preemption()
    assert h.last.preempted == [bg] and [rid for rid, _, _ in plan] == ["i1", "i2"]
    assert bg.status is RequestStatus.WAITING and ids(h.sched.background_waiting) == ["bg"]
    assert not h.sched.waiting and h.sched.num_background_running == 0
    h.run()
    assert i1.num_output_tokens == i2.num_output_tokens == 7 and bg.num_output_tokens == 10
    assert h.sched.num_preemptions == 1
    h.assert_no_leaks()


def test_background_requests_skip_queue_limits() -> None:
    h = PHarness(max_queued_requests=2, max_num_seqs=1, max_queue_wait=5.0, max_num_batched_tokens=100)
    h.add("a", prompt(3), max_tokens=50)
    h.add("b", prompt(3, 10))
    bgs = [h.add(f"bg{k}", prompt(3, 100 + 10 * k), background=True) for k in range(5)]  # never 429
    with pytest.raises(QueueFullError, match="max_queued_requests=2"):
        h.add("c", prompt(3, 20))
    assert h.step() == [("a", 3, True)]
    h.clock.now = 100.0
    assert h.step() == [("a", 1, True)]
    assert ids(h.last.timed_out) == ["b"]  # background requests may wait as long as they need
    assert ids(h.sched.background_waiting) == ids(bgs)
    h.sched.finish(h.sched.running[0], FinishReason.ABORT)
    h.run()
    assert all(r.is_finished and r.finish_reason is FinishReason.STOP for r in bgs)
    h.assert_no_leaks()


def test_finish_of_background_requests_waiting_and_running() -> None:
    h = PHarness(max_num_seqs=4, max_num_batched_tokens=100)
    run = h.add("run", prompt(6), max_tokens=5, background=True)
    wait = h.add("wait", prompt(3, 10), max_tokens=5, background=True)
    h.add("held", prompt(3, 20), max_tokens=5, background=True)  # the third waits for a seat
    h.step()
    assert h.sched.num_background_running == 2 and ids(h.sched.background_waiting) == ["held"]
    h.sched.finish(run, FinishReason.ABORT)
    h.sched.finish(h.sched.background_waiting[0], FinishReason.ABORT)
    assert run.block_ids == [] and not h.sched.background_waiting and h.sched.num_unfinished == 1
    h.check()
    h.run()
    assert wait.num_output_tokens == 5
    h.assert_no_leaks()


def test_n_siblings_share_the_prompt_in_the_background_queue() -> None:
    h = PHarness(max_num_batched_tokens=32)
    p = prompt(10)
    first = h.add("x-0", p, max_tokens=3, background=True)
    second = h.add("x-1", p, max_tokens=3, background=True, wait_for=first)
    other = h.add("y", prompt(3, 50), max_tokens=1, background=True)
    assert h.step() == [("x-0", 10, True), ("y", 3, True)]
    assert ids(h.sched.background_waiting) == ["x-1"] and other.is_finished
    assert h.step() == [("x-0", 1, True), ("x-1", 2, True)]
    assert second.num_cached_tokens == 8
    h.run()
    assert first.output_token_ids == second.output_token_ids
    h.assert_no_leaks()


# -- configuration and plumbing -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scheduling_policy": "lifo"}, "scheduling_policy must be one of fcfs, priority"),
        ({"background_max_seqs_share": 0.0}, "background_max_seqs_share must be in"),
        ({"background_max_seqs_share": 1.5}, "background_max_seqs_share must be in"),
        ({"background_max_tokens_share": -0.1}, "background_max_tokens_share must be in"),
        ({"background_max_tokens_share": 1.01}, "background_max_tokens_share must be in"),
    ],
)
def test_config_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SchedulerConfig(**kwargs)


def test_config_defaults() -> None:
    c = SchedulerConfig(scheduling_policy="priority", background_max_seqs_share=1.0, background_max_tokens_share=1.0)
    assert (c.max_background_seqs, c.max_background_tokens) == (c.max_num_seqs, c.max_num_batched_tokens)
    d = SchedulerConfig()
    assert (d.scheduling_policy, d.background_max_seqs_share, d.background_max_tokens_share) == ("fcfs", 0.5, 0.25)
    assert (d.background_busy_tokens, d.background_busy_prefill_every, d.background_busy_linger_s) == (8, 4, 1.0)
    g = GenerationRequest("r", [1, 2], SamplingParams())
    assert (g.priority, g.background) == (0, False)


def test_engine_copies_priority_and_background_onto_each_sequence(scripted_model_dir: Path) -> None:
    from swiftlm import LLM

    llm = LLM(str(scripted_model_dir), dtype="float32", max_model_len=64)
    sched = llm.engine.scheduler
    llm.engine.add_request(GenerationRequest("fg", [1, 2, 3], SamplingParams(max_tokens=2), priority=-4))
    llm.engine.add_request(GenerationRequest("bg", [1, 2, 3], SamplingParams(max_tokens=2, n=2), background=True))
    assert [(r.request_id, r.priority, r.background) for r in sched.waiting] == [("fg", -4, False)]
    assert [(r.request_id, r.background) for r in sched.background_waiting] == [("bg-0", True), ("bg-1", True)]
    while llm.engine.has_unfinished():
        llm.engine.step()
    assert sched.num_unfinished == 0
