"""Scheduler: which requests compute how many tokens this step. Touches no tensors.

One token budget per step. Running requests go first, decodes before prefill chunks, so a long
prompt never stalls the requests already generating; then waiting requests are admitted with
chunks that fill what is left of the budget. When blocks run out, a running request not yet
scheduled this step is preempted: its blocks are freed and it recomputes later (the output is
unchanged, since its tokens are kept).

``SchedulerConfig.scheduling_policy`` picks the order:

- "fcfs": waiting requests are admitted in arrival order; the most recently admitted gives way.
- "priority" (vLLM's): admitted in (priority, arrival) order, lowest value first; the running
  request with the largest (priority, arrival) gives way.

Background requests (Batch API lines), under either policy, wait in a queue of their own and run
in the room interactive requests leave. Each step's budget is spent in this order:

    |<----------------------------- max_num_batched_tokens ------------------------------>|
    | interactive decodes | interactive prefills | background (<= max_background_tokens) | admitted ...

While an interactive request runs or waits, the background share shrinks to
``background_busy_tokens`` a step. They are admitted only when no interactive request waits, hold at most ``max_background_seqs``
seats, are preempted before any interactive request, and are exempt from ``max_queued_requests``
and ``max_queue_wait``.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass

from swiftlm.cache.kv_manager import KVCacheManager, blocks_for
from swiftlm.config import SchedulerConfig
from swiftlm.core.request import FinishReason, Request, RequestStatus
from swiftlm.core.schedule import ScheduledRequest, SchedulerOutput


class QueueFullError(RuntimeError):
    """The waiting queue is at ``max_queued_requests``; the server answers 429."""


def _rank(request: Request) -> tuple[int, float]:
    """The "priority" policy's order: lower is more important."""
    return request.priority, request.arrival_time


@dataclass(slots=True)
class _Budget:
    """This step's tokens left: every request draws on ``total``, background ones on ``background`` too."""

    total: int
    background: int
    background_prefill: int  # of which prefill chunks

    def left(self, request: Request) -> int:
        if not request.background:
            return self.total
        if request.is_prefilling or request.status is RequestStatus.WAITING:
            return min(self.total, self.background, self.background_prefill)
        return min(self.total, self.background)

    def spend(self, request: Request, n: int) -> None:
        self.total -= n
        if request.background:
            self.background -= n
            if request.is_prefilling or request.status is RequestStatus.WAITING:
                self.background_prefill -= n


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, clock=time.monotonic) -> None:
        self.config = config
        self.kv = kv
        self.clock = clock
        self.waiting: deque[Request] = deque()  # interactive requests
        self.background_waiting: deque[Request] = deque()
        self.running: list[Request] = []  # both kinds, in admission order
        self.num_preemptions = 0
        self._by_priority = config.scheduling_policy == "priority"
        self._steps = 0
        self._interactive_seen = -float("inf")  # when an interactive request last ran or waited

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.background_waiting) + len(self.running)

    @property
    def num_background_waiting(self) -> int:
        return len(self.background_waiting)

    @property
    def num_background_running(self) -> int:
        return sum(r.background for r in self.running)

    def add_request(self, request: Request) -> None:
        if not request.background and len(self.waiting) >= self.config.max_queued_requests:
            raise QueueFullError(
                f"the server has {len(self.waiting)} requests waiting (max_queued_requests="
                f"{self.config.max_queued_requests}); retry later"
            )
        request.status = RequestStatus.WAITING
        self._enqueue(request, preempted=False)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._budget()
        now = self.clock()
        self._expire_waiting(now, out)
        self._schedule_running(budget, out)
        if not out.preempted:
            self._admit(self.waiting, budget, now, out)
            if not self.waiting:  # background requests only take what no interactive one waits for
                self._admit(self.background_waiting, budget, now, out)
        return out

    def _budget(self) -> _Budget:
        """This step's tokens. While an interactive request runs or waits, background requests
        get ``background_busy_tokens`` (decode rows, mostly: a step with a prefill chunk takes the
        slower general path), and a prefill chunk only every ``background_busy_prefill_every``-th
        step, so interactive steps stay short and batch lines still progress. "While" lasts
        ``background_busy_linger_s`` past the last one: the next request of a client that just got
        its answer does not arrive during a long background step."""
        self._steps += 1
        background = self.config.max_background_tokens
        prefill = background
        now = self.clock()
        if self.waiting or any(not r.background for r in self.running):
            self._interactive_seen = now
        if now - self._interactive_seen <= self.config.background_busy_linger_s:
            background = min(background, self.config.background_busy_tokens)
            every = self.config.background_busy_prefill_every
            prefill = background if every and self._steps % every == 0 else 0
        return _Budget(self.config.max_num_batched_tokens, background, prefill)

    def _schedule_running(self, budget: _Budget, out: SchedulerOutput) -> None:
        """Interactive decodes, interactive prefill chunks, then background ones: admission order
        within each group (a stable sort of ``running``). A decode's speculative draft tokens
        (``Request.draft_token_ids``) ride along in the budget left after one token for each
        decode still to come (``_drafts``). Runs over every running request every step: the
        request's counts are read as attributes (``num_tokens`` is ``len(all_token_ids) +
        num_pending``), not through its properties."""
        decodes: list[Request] = []
        prefills: list[Request] = []
        background: list[Request] = []
        for r in self.running:  # one pass where a sort by (background, prefilling) would call both per request
            if r.background:
                background.append(r)
            elif len(r.all_token_ids) + r.num_pending - r.num_computed_tokens > 1:
                prefills.append(r)
            else:
                decodes.append(r)
        if not background and not prefills:
            self._schedule_decodes(decodes, budget, out)
            return
        if background:
            background.sort(key=lambda r: r.is_prefilling)  # stable: decodes first, admission order kept
            order = decodes + prefills + background
        else:
            order = decodes + prefills
        decodes_left = len(decodes) + sum(1 for r in background if not r.is_prefilling)  # each keeps a budget token
        self._schedule_in_order(order, decodes_left, budget, out)

    def _schedule_in_order(self, order: list[Request], decodes_left: int, budget: _Budget, out: SchedulerOutput) -> None:
        """Schedule running requests in ``order`` while the budget lasts; ``decodes_left``: how many
        of them decode (each keeps a budget token while drafts are sized)."""
        block_size = self.kv.block_size
        running = RequestStatus.RUNNING
        scheduled = out.scheduled
        for request in order:
            if budget.total == 0:
                break
            if request.status is not running:
                continue  # preempted earlier in this loop
            num_tokens = len(request.all_token_ids) + request.num_pending
            computed = request.num_computed_tokens
            if request.num_pending and num_tokens >= request.token_limit:
                decodes_left -= num_tokens - computed <= 1
                continue  # the token a launched step is sampling ends it (overlapped steps)
            limit = budget.left(request) if request.background else budget.total
            if limit == 0:
                continue  # the background share of this step is spent
            left = num_tokens - computed
            n = left if left < limit else limit
            decodes_left -= left <= 1
            drafts = self._drafts(request, limit - n - decodes_left) if request.draft_token_ids else ()
            if not drafts and (computed + n + block_size - 1) // block_size > len(request.block_ids):
                self._allocate(request, n, out)  # it needs a block: free one, or preempt
            if request.status is running:
                scheduled.append(ScheduledRequest(request, n, drafts))
                if request.background:
                    budget.spend(request, n + len(drafts))
                else:
                    budget.total -= n + len(drafts)

    def _schedule_decodes(self, decodes: list[Request], budget: _Budget, out: SchedulerOutput) -> None:
        """``_schedule_running`` for a step of interactive decodes alone (most steps): the same choices,
        without the branches for prefill chunks and background shares. A decode computes its one
        token left (none while a launched step's token is still pending past its limit)."""
        block_size = self.kv.block_size
        running = RequestStatus.RUNNING
        scheduled = out.scheduled
        total = budget.total
        decodes_left = len(decodes)  # each keeps a budget token for itself
        for request in decodes:
            if total == 0:
                break
            if request.status is not running:
                continue  # preempted earlier in this loop
            decodes_left -= 1
            num_tokens = len(request.all_token_ids) + request.num_pending
            if request.num_pending and num_tokens >= request.token_limit:
                continue  # the token a launched step is sampling ends it (overlapped steps)
            computed = request.num_computed_tokens
            n = num_tokens - computed  # 0 or 1, and total >= 1
            drafts = self._drafts(request, total - n - decodes_left) if request.draft_token_ids else ()
            if not drafts and (computed + n + block_size - 1) // block_size > len(request.block_ids):
                self._allocate(request, n, out)  # it needs a block: free one, or preempt
            if request.status is running:
                scheduled.append(ScheduledRequest(request, n, drafts))
                total -= n + len(drafts)
        budget.total = total

    def _allocate(self, request: Request, n: int, out: SchedulerOutput) -> None:
        """Blocks for ``request``'s ``n`` new tokens, preempting (``_victim``) until they fit or the
        request itself gives way."""
        while not self.kv.allocate_slots(request, n):
            victim = self._victim(out.scheduled)
            self._preempt(victim, out)
            if victim is request:
                break

    def _drafts(self, request: Request, room: int) -> tuple[int, ...]:
        """The draft tokens a decoding request computes this step: its proposal, cut to ``room``
        budget tokens, and only if blocks for them are free without releasing a session or
        preempting anyone (then its blocks are allocated); else none."""
        drafts = tuple(request.draft_token_ids[: max(room, 0)])
        if not drafts or request.is_prefilling:
            return ()
        need = blocks_for(request.num_tokens + len(drafts), self.kv.block_size) - len(request.block_ids)
        if need > self.kv.pool.num_free_blocks or not self.kv.allocate_slots(request, 1 + len(drafts)):
            return ()
        return drafts

    def _victim(self, scheduled: list[ScheduledRequest]) -> Request:
        """The running request, not yet scheduled this step, that gives way: background before
        interactive; then the largest (priority, arrival) ("priority"), the latest admitted last."""
        taken = {id(s.request) for s in scheduled}
        candidates = [(i, r) for i, r in enumerate(self.running) if id(r) not in taken]
        if self._by_priority:
            return max(candidates, key=lambda c: (c[1].background, _rank(c[1]), c[0]))[1]
        return max(candidates, key=lambda c: (c[1].background, c[0]))[1]

    def _admit(self, queue: deque[Request], budget: _Budget, now: float, out: SchedulerOutput) -> None:
        """Admit from the head of ``queue`` (one kind of request) while budget, seats and blocks last."""
        skipped: list[Request] = []
        while queue and budget.left(queue[0]) > 0 and self._has_seat(queue[0]):
            request = queue.popleft()
            if not request.ready_to_share():
                skipped.append(request)  # an n>1 sibling still computing the shared prompt
                continue
            n = self.kv.admit(request, budget.left(request), now)
            if n == 0:
                queue.appendleft(request)
                break
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = request.num_computed_tokens
                request.metrics.first_scheduled_time = now
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            out.scheduled.append(ScheduledRequest(request, n))
            budget.spend(request, n)
        queue.extendleft(reversed(skipped))

    def _has_seat(self, request: Request) -> bool:
        if len(self.running) >= self.config.max_num_seqs:
            return False
        return not request.background or self.num_background_running < self.config.max_background_seqs

    def _enqueue(self, request: Request, *, preempted: bool) -> None:
        """Put a waiting request in its queue. "fcfs": at the back, a preempted one at the head.
        "priority": by (priority, arrival), after its equals, a preempted one before them."""
        queue = self.background_waiting if request.background else self.waiting
        if not self._by_priority:
            if preempted:
                queue.appendleft(request)
            else:
                queue.append(request)
            return
        search = bisect.bisect_left if preempted else bisect.bisect_right
        queue.insert(search(queue, _rank(request), key=_rank), request)

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = request.num_inflight = 0  # a launched step's KV is dropped with it
        request.status = RequestStatus.WAITING
        request.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self._enqueue(request, preempted=True)
        out.preempted.append(request)

    def _expire_waiting(self, now: float, out: SchedulerOutput) -> None:
        """Refuse interactive requests never scheduled within ``max_queue_wait`` (background ones wait)."""
        limit = self.config.max_queue_wait
        if limit is None:
            return
        for request in list(self.waiting):
            if request.num_cached_tokens < 0 and now - request.arrival_time > limit:
                self.waiting.remove(request)
                self.finish(request, FinishReason.ERROR, now)
                request.error = f"request waited more than max_queue_wait={limit}s in the queue"
                out.timed_out.append(request)

    def finish(self, request: Request, reason: FinishReason, now: float | None = None,
               keep_output: int | None = None) -> None:
        """End a request (any state) and release its blocks; safe to call once per request.
        ``keep_output``: end it at that many output tokens (``Request.keep_output``), before its
        blocks go to its session or back to the pool."""
        if request.is_finished:
            return
        now = self.clock() if now is None else now
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        elif request in self.background_waiting:
            self.background_waiting.remove(request)
        # what launched steps compute for it past this point is dropped: its KV and tokens end here
        request.num_computed_tokens -= request.num_inflight
        request.num_inflight = request.num_pending = 0
        if keep_output is not None:
            request.keep_output(keep_output)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.metrics.finished_time = now
        self.kv.release_finished(request, now)
