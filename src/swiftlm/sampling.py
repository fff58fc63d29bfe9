"""SamplingParams: how one request's tokens are chosen and when it stops (vLLM-compatible names)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields, replace
from typing import Any

from swiftlm.core.structured import StructuredOutput, from_vllm

_GREEDY_EPS = 1e-5
# vLLM's SamplingParams fields that change nothing here (any value accepted), and why
VLLM_NO_OPS = {
    "detokenize": "the text is always produced next to the token ids",
    "spaces_between_special_tokens": "byte-level tokenizers (Qwen, Llama-3) decode special tokens as written",
    "output_kind": "LLM.generate returns final outputs and LLM.stream deltas, whatever is asked",
}
# vLLM's fields swiftlm does not implement: accepted at their "off" value only, else a ValueError
VLLM_UNSUPPORTED = {
    "truncate_prompt_tokens": "prompts are never truncated here; shorten the prompt",
    "allowed_token_ids": "use logit_bias, or the server's structured outputs",
    "bad_words": "use logit_bias on the words' token ids",
    "logits_processors": "custom logits processors are not supported",
    "use_beam_search": "beam search is not implemented",
}


def _vllm_fields(cls: type) -> type:
    """Let ``cls(...)`` take vLLM's fields listed above, and make an unknown keyword a TypeError
    that names the known ones."""
    init = cls.__init__
    known = {f.name for f in fields(cls)}

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for name in VLLM_NO_OPS.keys() & kwargs.keys():
            del kwargs[name]
        for name in VLLM_UNSUPPORTED.keys() & kwargs.keys():
            if kwargs.pop(name) not in (None, False):
                raise ValueError(f"{name} is not supported: {VLLM_UNSUPPORTED[name]}")
        unknown = kwargs.keys() - known
        if unknown:
            everything = ", ".join(sorted(known | VLLM_NO_OPS.keys() | VLLM_UNSUPPORTED.keys()))
            raise TypeError(f"unknown SamplingParams fields: {', '.join(sorted(unknown))}; known: {everything}")
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


@_vllm_fields
@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling and stopping settings.

    ``temperature == 0`` is greedy. ``top_k <= 0`` and ``top_p == 1`` and ``min_p == 0`` disable
    their filters. ``logprobs=None`` returns no logprobs; ``logprobs=k`` returns the sampled token's
    logprob and the ``k`` most likely tokens' logprobs at each step. ``prompt_logprobs=k`` returns,
    for every prompt token, its logprob and the ``k`` most likely tokens' at that position
    (``RequestOutput.prompt_logprobs``, the first entry None). ``max_tokens=0`` generates nothing:
    the request ends once its prompt is computed, with finish reason ``"length"``.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    skip_special_tokens: bool = True
    thinking_budget: int | None = None
    # vLLM's V1 engine dropped best_of; kept so vLLM code runs: None, 1 or n (no extra candidates)
    best_of: int | None = None
    thinking_token_budget: int | None = None  # vLLM's name: read into thinking_budget, then None
    # what the output must match (constrained decoding); a StructuredOutput, or vLLM's
    # StructuredOutputsParams / GuidedDecodingParams shape (an object or a dict), converted
    structured_outputs: StructuredOutput | None = None
    guided_decoding: Any = None  # vLLM's older name: read into structured_outputs, then None
    # swiftlm's: speculative decoding for this request (an engine with a speculative config): None
    # the engine's draft length, 0 off, k at most k draft tokens a step (capped by the engine's)
    num_speculative_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.guided_decoding is not None:
            if self.structured_outputs is not None:
                raise ValueError("structured_outputs and guided_decoding are two names of one field; give one")
            object.__setattr__(self, "structured_outputs", self.guided_decoding)
            object.__setattr__(self, "guided_decoding", None)
        object.__setattr__(self, "structured_outputs", from_vllm(self.structured_outputs))
        if self.thinking_token_budget is not None:
            if self.thinking_budget is not None and self.thinking_budget != self.thinking_token_budget:
                raise ValueError(
                    f"thinking_budget {self.thinking_budget} and thinking_token_budget {self.thinking_token_budget} "
                    "disagree; give one of them"
                )
            object.__setattr__(self, "thinking_budget", self.thinking_token_budget)
            object.__setattr__(self, "thinking_token_budget", None)
        # Accept lists and a bare string for convenience; store tuples so the object stays hashable-ish.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop or ()))
        if not isinstance(self.stop_token_ids, tuple):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        if self.logit_bias is None:
            object.__setattr__(self, "logit_bias", {})
        else:
            object.__setattr__(self, "logit_bias", {int(k): float(v) for k, v in self.logit_bias.items()})
        self._validate()

    def _validate(self) -> None:
        checks = [
            (self.n >= 1, f"n must be at least 1, got {self.n}"),
            (self.temperature >= 0.0, f"temperature must be non-negative, got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}"),
            (self.max_tokens is None or self.max_tokens >= 0, f"max_tokens must be non-negative, got {self.max_tokens}"),
            (self.min_tokens >= 0, f"min_tokens must be non-negative, got {self.min_tokens}"),
            (
                self.max_tokens is None or self.min_tokens <= self.max_tokens,
                f"min_tokens {self.min_tokens} must not exceed max_tokens {self.max_tokens}",
            ),
            (self.logprobs is None or 0 <= self.logprobs <= 20, f"logprobs must be in [0, 20], got {self.logprobs}"),
            (
                self.prompt_logprobs is None or self.prompt_logprobs >= 0,
                f"prompt_logprobs must be non-negative, got {self.prompt_logprobs}",
            ),
            (self.repetition_penalty > 0.0, f"repetition_penalty must be positive, got {self.repetition_penalty}"),
            (-2.0 <= self.presence_penalty <= 2.0, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"),
            (-2.0 <= self.frequency_penalty <= 2.0, f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"),
            (self.thinking_budget is None or self.thinking_budget >= 0, f"thinking_budget must be non-negative, got {self.thinking_budget}"),
            (
                self.best_of in (None, 1, self.n),
                f"best_of {self.best_of} is not supported (vLLM's V1 engine dropped it too): leave it unset, "
                f"or equal to n ({self.n}); for more candidates raise n",
            ),
            (all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty strings"),
            (
                self.num_speculative_tokens is None or self.num_speculative_tokens >= 0,
                f"num_speculative_tokens must be non-negative, got {self.num_speculative_tokens}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        for bias in self.logit_bias.values():
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias}")

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    def with_updates(self, **changes: Any) -> SamplingParams:
        return replace(self, **changes)

    @classmethod
    def from_generation_config(cls, gen: dict[str, Any], **overrides: Any) -> SamplingParams:
        """Defaults from a checkpoint's generation_config.json, then the caller's overrides."""
        base: dict[str, Any] = {}
        if gen.get("do_sample") is False:
            base["temperature"] = 0.0
        for key in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
            if key in gen and gen[key] is not None and not (key == "temperature" and "temperature" in base):
                base[key] = gen[key]
        base.update(overrides)
        return cls(**base)
