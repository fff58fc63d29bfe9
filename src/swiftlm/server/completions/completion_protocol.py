"""POST /v1/completions' (legacy text completions) wire protocol: the request, the whole answer
and the streamed chunks, with the legacy logprobs.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, StrictBool, StrictStr, field_validator, model_validator

from swiftlm.server.completions.sampling_protocol import MAX_TOP_LOGPROBS, BaseSamplingRequest, PromptLogprobs
from swiftlm.server.protocol import UsageInfo, _int, _now, _Response, new_id


def _check_prompt(value: Any) -> Any:
    if isinstance(value, str):
        return value
    message = "prompt must be a string, a list of strings, a list of token ids, or a list of lists of token ids"
    if not isinstance(value, list) or not value:
        raise ValueError(message + (" (got an empty list)" if value == [] else ""))
    if all(isinstance(x, str) for x in value) or all(type(x) is int for x in value):
        return value
    if all(isinstance(x, list) and x and all(type(t) is int for t in x) for x in value):
        return value
    raise ValueError(message)


class CompletionRequest(BaseSamplingRequest):
    """POST /v1/completions (legacy). ``logprobs`` is the number of top tokens per step (0..20;
    OpenAI allows 5). ``max_tokens`` defaults to 16 as in OpenAI; null means "up to the context
    limit"; when it is left out, ``max_new_tokens`` is used if given. ``suffix`` is rejected.
    ``echo: true`` returns the prompt before the completion, and with ``logprobs`` the prompt
    tokens' logprobs first (the first token's is null: nothing predicts it); ``max_tokens: 0``
    (only with ``echo``) scores the prompt and generates nothing. ``prompt_logprobs: k`` (vLLM's
    field) adds each choice's ``prompt_logprobs`` list in vLLM's shape."""

    null_fields: ClassVar[frozenset[str]] = frozenset({"max_tokens"})

    prompt: Annotated[str | list[str] | list[int] | list[list[int]], BeforeValidator(_check_prompt)]
    suffix: StrictStr | None = None
    echo: StrictBool = False
    logprobs: _int(ge=0, le=MAX_TOP_LOGPROBS) | None = None
    max_tokens: _int(ge=0) | None = 16

    @model_validator(mode="after")
    def _zero_tokens_needs_echo(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise ValueError(
                "max_tokens 0 generates nothing; it is allowed only with echo: true (to score the prompt), "
                "else ask for at least 1"
            )
        return self

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix is not supported (no fill-in-the-middle); leave it out")
        return None


class CompletionLogprobs(_Response):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(_Response):
    always_present: ClassVar[tuple[str, ...]] = ("finish_reason",)

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None  # vLLM's, with the request's prompt_logprobs


class CompletionResponse(_Response):
    id: str = Field(default_factory=lambda: new_id("cmpl-"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
    swiftlm: dict[str, Any] | None = None  # extension: the response cache's hit or miss


class CompletionChunk(CompletionResponse):
    """One SSE event of a streamed legacy completion (OpenAI keeps object "text_completion")."""
