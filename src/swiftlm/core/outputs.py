"""What the engine hands back: per-request outputs, whole or as deltas."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class CompletionOutput:
    """One generated sequence (of ``n``) of a request.

    ``logprobs[i]`` maps token id -> logprob at step ``i``: the sampled token first, then the
    requested top tokens. In a delta, ``text``/``token_ids``/``logprobs`` hold only what is new.
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_computed_prompt_tokens: int = 0  # prompt tokens this request actually ran through the model
    num_preemptions: int = 0


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
    error: str | None = None
    extra: dict = field(default_factory=dict)
    # with ``SamplingParams.prompt_logprobs=k``: one entry per prompt token, the first None, then
    # token id -> logprob holding the prompt token's and the k most likely tokens' at that position.
    # Sent once, in the first output after the whole prompt is computed (None in the others).
    prompt_logprobs: list[dict[int, float] | None] | None = None


@dataclass(frozen=True, slots=True)
class SequenceStop:
    """A sequence the output processor ended on a stop string, for the engine to end too
    (``Engine.stop_sequence``): at ``num_output_tokens`` tokens, the KV of later ones dropped. When
    the engine ended it already, a session it left is trimmed to ``token_ids`` (the prompt and the
    tokens kept; empty without a session), so the next turn extends what the client saw."""

    request_id: str
    index: int
    num_output_tokens: int
    stop_reason: str | None
    session_id: str | None = None
    token_ids: tuple[int, ...] = ()
