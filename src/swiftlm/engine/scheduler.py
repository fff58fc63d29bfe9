"""Scheduler: which requests compute how many tokens this step. Touches no tensors.

One token budget per step. Running requests go first, decodes before prefill chunks, so a long
prompt never stalls the requests already generating; then waiting requests are admitted in
arrival order with chunks that fill what is left of the budget. When blocks run out, the most
recently admitted running request is preempted: its blocks are freed and it recomputes later
(the output is unchanged, since its tokens are kept).
"""

from __future__ import annotations

import time
from collections import deque

from swiftlm.cache.kv_manager import KVCacheManager
from swiftlm.config import SchedulerConfig
from swiftlm.core.request import FinishReason, Request, RequestStatus
from swiftlm.core.schedule import ScheduledRequest, SchedulerOutput


class QueueFullError(RuntimeError):
    """The waiting queue is at ``max_queued_requests``; the server answers 429."""


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, clock=time.monotonic) -> None:
        self.config = config
        self.kv = kv
        self.clock = clock
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add_request(self, request: Request) -> None:
        if len(self.waiting) >= self.config.max_queued_requests:
            raise QueueFullError(
                f"the server has {len(self.waiting)} requests waiting (max_queued_requests="
                f"{self.config.max_queued_requests}); retry later"
            )
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        now = self.clock()
        self._expire_waiting(now, out)

        # 1. running requests: decodes first, then prefill chunks in admission order
        decodes = [r for r in self.running if not r.is_prefilling]
        prefills = [r for r in self.running if r.is_prefilling]
        scheduled: set[int] = set()
        for request in decodes + prefills:
            if budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            while not self.kv.allocate_slots(request, n):
                # the most recently admitted request not yet scheduled this step gives way
                victim = next(r for r in reversed(self.running) if id(r) not in scheduled)
                self._preempt(victim, out)
                if victim is request:
                    break
            if request.status is RequestStatus.RUNNING:
                out.scheduled.append(ScheduledRequest(request, n))
                scheduled.add(id(request))
                budget -= n

        # 2. waiting requests, in arrival order, while budget, sequence slots and blocks last
        if not out.preempted:
            skipped: list[Request] = []
            while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
                request = self.waiting.popleft()
                if not request.ready_to_share():
                    skipped.append(request)  # an n>1 sibling still computing the shared prompt
                    continue
                n = self.kv.admit(request, budget, now)
                if n == 0:
                    self.waiting.appendleft(request)
                    break
                if request.num_cached_tokens < 0:
                    request.num_cached_tokens = request.num_computed_tokens
                    request.metrics.first_scheduled_time = now
                request.status = RequestStatus.RUNNING
                self.running.append(request)
                out.scheduled.append(ScheduledRequest(request, n))
                budget -= n
            self.waiting.extendleft(reversed(skipped))
        return out

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        request.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        out.preempted.append(request)

    def _expire_waiting(self, now: float, out: SchedulerOutput) -> None:
        limit = self.config.max_queue_wait
        if limit is None:
            return
        for request in list(self.waiting):
            if request.num_cached_tokens < 0 and now - request.arrival_time > limit:
                self.waiting.remove(request)
                self.finish(request, FinishReason.ERROR, now)
                request.error = f"request waited more than max_queue_wait={limit}s in the queue"
                out.timed_out.append(request)

    def finish(self, request: Request, reason: FinishReason, now: float | None = None) -> None:
        """End a request (any state) and release its blocks; safe to call once per request."""
        if request.is_finished:
            return
        now = self.clock() if now is None else now
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.metrics.finished_time = now
        self.kv.release_finished(request, now)
