"""SamplingParams: how one request's tokens are chosen and when it stops (vLLM-compatible names)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

_GREEDY_EPS = 1e-5


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling and stopping settings.

    ``temperature == 0`` is greedy. ``top_k <= 0`` and ``top_p == 1`` and ``min_p == 0`` disable
    their filters. ``logprobs=None`` returns no logprobs; ``logprobs=k`` returns the sampled token's
    logprob and the ``k`` most likely tokens' logprobs at each step.
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
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    skip_special_tokens: bool = True
    thinking_budget: int | None = None

    def __post_init__(self) -> None:
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
            (self.max_tokens is None or self.max_tokens >= 1, f"max_tokens must be at least 1, got {self.max_tokens}"),
            (self.min_tokens >= 0, f"min_tokens must be non-negative, got {self.min_tokens}"),
            (
                self.max_tokens is None or self.min_tokens <= self.max_tokens,
                f"min_tokens {self.min_tokens} must not exceed max_tokens {self.max_tokens}",
            ),
            (self.logprobs is None or 0 <= self.logprobs <= 20, f"logprobs must be in [0, 20], got {self.logprobs}"),
            (self.repetition_penalty > 0.0, f"repetition_penalty must be positive, got {self.repetition_penalty}"),
            (-2.0 <= self.presence_penalty <= 2.0, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"),
            (-2.0 <= self.frequency_penalty <= 2.0, f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"),
            (self.thinking_budget is None or self.thinking_budget >= 0, f"thinking_budget must be non-negative, got {self.thinking_budget}"),
            (all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty strings"),
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
