"""What the scheduler decides for one step: which requests compute how many tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

from swiftlm.core.request import Request


@dataclass(slots=True)  # not frozen: built for every running request every step (a frozen init costs ~4x)
class ScheduledRequest:
    request: Request
    num_new_tokens: int  # computes all_token_ids[num_computed : num_computed + num_new_tokens]
    # speculative decoding: guessed tokens after those, computed in the same step (a decoding
    # request only); the rows at the last real token and at each draft token all sample
    draft_token_ids: tuple[int, ...] = ()

    @property
    def num_rows(self) -> int:
        """Query rows this request adds to the step: its new tokens and its draft tokens."""
        return self.num_new_tokens + len(self.draft_token_ids)

    @property
    def samples(self) -> bool:
        """This step brings the request level with its tokens, so it samples the next one (unless
        the request generates nothing: ``max_tokens=0`` only scores its prompt)."""
        r = self.request
        return r.num_computed_tokens + self.num_new_tokens == r.num_tokens and r.sampling_params.max_tokens != 0


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    timed_out: list[Request] = field(default_factory=list)  # refused: waited past max_queue_wait

    @property
    def num_tokens(self) -> int:
        return sum(s.num_rows for s in self.scheduled)

    def __bool__(self) -> bool:
        return bool(self.scheduled)
