"""Request: one sequence being generated, and its single progress counter.

``num_computed_tokens`` counts the tokens of ``all_token_ids`` (prompt + output) whose KV is in
the cache, or is being written by a step already launched. Prefill, chunked prefill, prefix hits,
session reuse, recompute after preemption and decode are all the same thing: the counter catching
up with ``num_tokens``. A step that brings the counter level with ``num_tokens`` samples the next
token.

With overlapped steps (``EngineConfig.async_scheduling``) the engine schedules step N+1 before step
N's sampled tokens reach the host, so two counts say what is not confirmed yet:

    all_token_ids:  t0 .. t(c-1) | pending (sampled by a launched step, not appended yet)
    num_tokens  = len(all_token_ids) + num_pending
    confirmed   = num_computed_tokens - num_inflight   (KV written by steps whose results are in)

Serial steps leave both at 0 between steps.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from swiftlm.core.outputs import RequestMetrics
from swiftlm.sampling import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    eos_token_ids: frozenset[int] = frozenset()
    session_id: str | None = None
    prompt: str | None = None
    index: int = 0  # which of the parent's n samples this is
    wait_for: Request | None = None  # an n>1 sibling whose prompt KV this request will share
    thinking: bool = False  # the prompt opens a reasoning section the model writes first
    think_end_ids: tuple[int, ...] = ()  # tokens that close it ("</think>", "\n\n")
    think_start_ids: tuple[int, ...] = ()  # tokens that open it ("<think>", "\n")
    priority: int = 0  # lower is served earlier under the "priority" policy
    background: bool = False  # a Batch API line: runs in the room interactive requests leave
    token_limit: int = 1 << 62  # num_tokens at which it ends for length (max_tokens, the context window)

    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # set when first scheduled: tokens reused from a cache
    block_ids: list[int] = field(default_factory=list)
    num_registered_blocks: int = 0  # leading blocks keyed in the prefix cache
    last_block_hash: int | None = None
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    generator: torch.Generator | None = None
    forced_tokens: deque[int] = field(default_factory=deque)
    thinking_closed: bool = False
    # structured output: the grammar state (``runner.structured.GrammarState``) and the output index
    # where the grammar starts (0; None while the reasoning section is open: the reasoning is free)
    grammar: Any = None
    grammar_start: int | None = 0
    cumulative_logprob: float = 0.0
    # speculative decoding: the tokens proposed to follow ``all_token_ids`` this step (set by the
    # engine's proposer before scheduling; the scheduler may take fewer), and the proposer's state
    draft_token_ids: list[int] = field(default_factory=list)
    speculation: Any = None
    # the lead sequence of a request with ``prompt_logprobs``: one entry per prompt token scored so
    # far (the first is None: nothing predicts it); None for every other request
    prompt_logprobs: list[dict[int, float] | None] | None = None
    # overlapped steps: output tokens sampled by launched steps and not appended yet, and the tokens
    # those steps compute (counted in num_computed_tokens, not confirmed until their results are in)
    num_pending: int = 0
    num_inflight: int = 0
    metrics: RequestMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids)
        self.metrics = RequestMetrics(arrival_time=self.arrival_time)
        if self.index == 0 and self.sampling_params.prompt_logprobs is not None:
            self.prompt_logprobs = [None]
        if self.sampling_params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.sampling_params.seed)

    @property
    def num_tokens(self) -> int:
        """Known tokens and the ones launched steps are sampling."""
        return len(self.all_token_ids) + self.num_pending

    @property
    def num_confirmed_tokens(self) -> int:
        """Computed tokens whose step's results are in (their KV can be keyed and shared)."""
        return self.num_computed_tokens - self.num_inflight

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def is_prefilling(self) -> bool:
        """More than one token left to compute (prompt, or recompute after preemption)."""
        return self.num_tokens - self.num_computed_tokens > 1

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Some prompt tokens still lack their logprobs. Such a request computes its whole prompt
        (no prefix-cache or session reuse): reused KV has no logits to score it with."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens

    @property
    def grammar_active(self) -> bool:
        """The next token is constrained by the request's grammar."""
        return self.grammar is not None and self.grammar_start is not None and self.num_output_tokens >= self.grammar_start

    def keep_output(self, num_output_tokens: int) -> None:
        """Drop the output tokens after the first ``num_output_tokens`` (a stop string the front end
        found after the engine ran past it), and the computed count with them: at most every kept
        token but the last, as for a sequence that ended by itself. Call it with no step in flight."""
        extra = self.num_output_tokens - num_output_tokens
        if extra <= 0:
            return
        del self.output_token_ids[num_output_tokens:]
        del self.all_token_ids[len(self.all_token_ids) - extra:]
        self.num_computed_tokens = min(self.num_computed_tokens, len(self.all_token_ids) - 1)

    def append_output(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def ready_to_share(self) -> bool:
        """For n > 1: the sibling has computed the shared prompt (or will never)."""
        w = self.wait_for
        return w is None or w.is_finished or w.num_confirmed_tokens >= w.num_prompt_tokens - 1
