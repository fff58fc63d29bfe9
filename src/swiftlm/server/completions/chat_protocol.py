"""POST /v1/chat/completions' wire protocol: messages and tools, the request, the whole answer and
the streamed chunks (with their logprobs).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StrictBool, StrictStr, ValidationInfo, field_validator, model_validator

from swiftlm.server.completions.sampling_protocol import MAX_TOP_LOGPROBS, BaseSamplingRequest, PromptLogprobs
from swiftlm.server.protocol import (
    ReasoningEffort,
    ThinkingSwitch,
    UsageInfo,
    _check_template_kwargs,
    _int,
    _now,
    _Request,
    _Response,
    new_id,
)

# ---------------------------------------------------------------- messages and tools


class TextContentPart(_Request):
    type: Literal["text"]  # required: ChatMessage refuses a part without it
    text: StrictStr


class FunctionCall(_Request):
    name: StrictStr
    arguments: StrictStr | dict[str, Any] = "{}"  # OpenAI sends a JSON string; templates take both


class ToolCall(_Request):
    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    """One message of a conversation.

    ``content`` is a string, a list of text parts (joined with "\\n" for the template), or null
    (an assistant message that only carries tool calls). Parts of other types (image_url,
    input_audio, ...) are rejected: the models served are text-only. A ``developer`` message is
    rendered as ``system`` (see request_mapping.chat_messages). ``reasoning`` is accepted as an
    alias of ``reasoning_content``.
    """

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: StrictStr | list[TextContentPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: StrictStr | None = None
    reasoning_content: StrictStr | None = None
    reasoning: StrictStr | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError("content must be a string, a list of content parts, or null")
        for j, part in enumerate(value):
            if isinstance(part, TextContentPart):
                continue
            if not isinstance(part, dict):
                raise ValueError(f"content part {j} must be an object like {{'type': 'text', 'text': '...'}}")
            kind = part.get("type")
            if kind != "text":
                raise ValueError(f"content part {j} has type {kind!r}; only 'text' parts are supported")
            if not isinstance(part.get("text"), str):
                raise ValueError(f"content part {j} of type 'text' needs a string 'text'")
        return value

    @model_validator(mode="after")
    def _content_required(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        return self


class FunctionDefinition(_Request):
    name: StrictStr
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(_Request):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Request):
    name: StrictStr


class NamedToolChoice(_Request):
    type: Literal["function"] = "function"
    function: NamedFunction


class ResponseFormat(_Request):
    """"text" (no constraint), "json_object" (any JSON object) or "json_schema" (``json_schema``:
    ``{"name", "schema", "strict"}``; the output matches ``schema``): enforced by constrained
    decoding (``swiftlm.server.completions.structured_mapping``)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


# ---------------------------------------------------------------- request


class ChatCompletionRequest(BaseSamplingRequest):
    """POST /v1/chat/completions.

    Length limit precedence: max_completion_tokens > max_tokens > max_new_tokens > the server's
    default (see request_mapping). ``top_logprobs`` (0..20) requires ``logprobs: true``.
    Thinking: top-level ``enable_thinking`` > ``chat_template_kwargs.enable_thinking`` >
    ``reasoning_effort`` > the server's default template kwargs > ``--default-thinking`` > on (the
    table is ``swiftlm.core.generation.resolve_thinking_choice``'s); "auto" leaves the decision
    to the server's rule set (``swiftlm.text.thinking_rules``). ``cache: false``: not answered from
    nor stored in the response cache (``swiftlm.server.answer_cache.policy``). ``return_reasoning: false`` drops the reasoning
    from the response (it is still generated unless thinking is off); ``thinking_budget`` (vLLM's
    name: ``thinking_token_budget``, an alias; sending both with different values is an error)
    caps the reasoning tokens, else ``reasoning_effort``'s default budget does
    (``swiftlm.core.generation.REASONING_EFFORT_BUDGETS``). ``tools`` are rendered into the
    prompt and the calls parsed from the answer; ``tool_choice`` "none" leaves them out, and
    "required" or a named function are enforced by constrained decoding; ``parallel_tool_calls:
    false`` allows one call (``swiftlm.server.completions.tool_choice``). ``session_reset: true`` starts
    the ``session_id``'s conversation over from this request's messages (see
    ``swiftlm.text.session_prompt``).
    """

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: _int(ge=1) | None = None
    logprobs: StrictBool = False
    top_logprobs: _int(ge=0, le=MAX_TOP_LOGPROBS) | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    enable_thinking: ThinkingSwitch = None  # "auto": the server's rule set decides
    reasoning_effort: ReasoningEffort | None = None
    return_reasoning: StrictBool = True
    thinking_budget: _int(ge=0) | None = None
    thinking_token_budget: _int(ge=0) | None = None  # vLLM's name for thinking_budget
    session_reset: StrictBool = False

    @model_validator(mode="after")
    def _one_thinking_budget(self) -> ChatCompletionRequest:
        if self.thinking_token_budget is not None:
            if self.thinking_budget is not None and self.thinking_budget != self.thinking_token_budget:
                raise ValueError(
                    f"thinking_budget {self.thinking_budget} and thinking_token_budget {self.thinking_token_budget} "
                    "are two names of one field; send one"
                )
            self.thinking_budget = self.thinking_token_budget
        return self

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs requires logprobs to be true")
        return value

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else _check_template_kwargs(value)


# ---------------------------------------------------------------- responses


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(_Response):
    content: list[TokenLogprob] | None = None


class ChatCompletionMessage(_Response):
    always_present: ClassVar[tuple[str, ...]] = ("content",)

    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning: str | None = None  # current vLLM's name
    reasoning_content: str | None = None  # older vLLM's, read by most clients; the same text
    tool_calls: list[ToolCall] | None = None


class ChatCompletionChoice(_Response):
    index: int
    message: ChatCompletionMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None  # "stop" | "length" | "tool_calls" | "abort"
    stop_reason: int | str | None = None  # vLLM: the stop token id or string that ended it


class ChatCompletionResponse(_Response):
    id: str = Field(default_factory=lambda: new_id("chatcmpl-"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
    prompt_logprobs: PromptLogprobs | None = None  # vLLM's, with the request's prompt_logprobs
    swiftlm: dict[str, Any] | None = None  # extension: the thinking decision, the response cache's hit or miss


class DeltaFunctionCall(_Response):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_Response):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class DeltaMessage(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning: str | None = None  # as in ChatCompletionMessage: both names, the same text
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatCompletionChunkChoice(_Response):
    always_present: ClassVar[tuple[str, ...]] = ("finish_reason",)

    index: int
    delta: DeltaMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(_Response):
    """One SSE event of a streamed chat completion. All chunks of a stream share id and created;
    with stream_options.include_usage the last chunk has ``choices: []`` and the usage."""

    id: str = Field(default_factory=lambda: new_id("chatcmpl-"))
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatCompletionChunkChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
    swiftlm: dict[str, Any] | None = None  # extension, on the first chunk: as ChatCompletionResponse's
