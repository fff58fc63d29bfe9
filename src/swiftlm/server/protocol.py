"""The OpenAI-compatible wire protocol: pydantic models for requests and responses.

Requests (/v1/chat/completions, /v1/completions, /tokenize, /detokenize):

- Unknown fields are ignored: clients send many we have no use for (metadata, store, ...).
- Known fields are typed as strictly as OpenAI's API: a string is never a number or a bool
  (``"max_tokens": "12"``, ``"temperature": "hot"``, ``"stream": "yes"`` are errors), a bool is
  never a number; an int is accepted where a float is expected (``"temperature": 1``).
  NaN and infinities are rejected.
- ``null`` means "not given": the field takes its default (OpenAI documents most fields as
  nullable). One exception: ``CompletionRequest.max_tokens: null`` means "up to the context
  limit" (vLLM's reading); left out, it is 16 (OpenAI's default).
- vLLM-style extensions (top_k, min_p, enable_thinking, session_id, ...) are top-level fields:
  the OpenAI SDK's and LangChain's ``extra_body`` merge into the top level of the JSON body. A
  client that writes the JSON by hand may instead nest them in an ``"extra_body": {...}`` object of
  the body: its keys are read as if they were top-level, and a top-level field wins on conflict
  (a top-level null does not hide a nested value: null means "not given").
- Checks that need the model (vocabulary size, context window) or the server's limits (n) are in
  request_mapping.py, which also turns a request into SamplingParams and chat-template inputs.

Responses are dumped with ``model_dump_json(exclude_none=True)`` on the hot path. The fields
OpenAI always sends stay present as ``null`` even then: ``message.content`` and, in streamed and
legacy-completion choices, ``finish_reason``. Measured on this CPU: building and dumping one
stream chunk takes ~9 us, dumping alone ~4 us; ``model_construct`` is no faster (pure Python),
so build them normally.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AllowInfNan,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.types import Strict

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 4096  # each stop string: every generated token is checked against the tail of the text
MAX_LOGIT_BIAS = 2048  # entries of a logit_bias map (each is applied at every step)
MAX_TOP_LOGPROBS = 20
# Keys that ChatTemplate.render sets itself; a request may not pass them as template kwargs.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "continue_final_message", "chat_template", "tokenize"}
)


def _float(**constraints: Any) -> Any:
    """A float field that accepts ints but not strings, bools, NaN or infinities."""
    return Annotated[float, Strict(), AllowInfNan(False), Field(**constraints)]


def _int(**constraints: Any) -> Any:
    return Annotated[StrictInt, Field(**constraints)]


Id = Annotated[StrictStr, Field(min_length=1, max_length=256)]
TokenId = _int(ge=0)


def _stop_list(value: Any) -> Any:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise ValueError("stop must be a string or a list of strings")
    return value


# A bare string or a list of up to 16 strings; always a list after validation.
Stop = Annotated[list[Annotated[StrictStr, Field(max_length=MAX_STOP_CHARS)]], BeforeValidator(_stop_list),
                 Field(max_length=MAX_STOP_STRINGS)]


def _thinking_switch(value: Any) -> Any:
    if value is None or isinstance(value, bool) or value == "auto":
        return value
    raise ValueError('enable_thinking must be true, false or "auto"')


# enable_thinking: true, false, or "auto" (the server's rule set decides; swiftlm.text.thinking_rules)
ThinkingSwitch = Annotated[StrictBool | Literal["auto"] | None, BeforeValidator(_thinking_switch)]
# OpenAI's reasoning_effort; its effect on thinking: swiftlm.core.generation.resolve_thinking
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high"]


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def _now() -> int:
    return int(time.time())


class _Request(BaseModel):
    """Base of request models: unknown fields ignored, a null field takes its default; in a
    request body (``reads_extra_body``) the keys of a nested ``extra_body`` object count as
    top-level fields, the top level winning on conflict."""

    model_config = ConfigDict(extra="ignore")
    null_fields: ClassVar[frozenset[str]] = frozenset()  # fields where null is a value of its own
    reads_extra_body: ClassVar[bool] = False

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        where = _lone_surrogate(data, "")
        if where is not None:
            raise ValueError(f"{where or 'the body'} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff "
                             "escape), which is not text; send valid Unicode")
        keep = cls.null_fields
        if cls.reads_extra_body and "extra_body" in data:
            data = _merge_extra_body(data, keep)
        return {k: v for k, v in data.items() if v is not None or k in keep}


def _lone_surrogate(value: Any, path: str) -> str | None:
    """The path of the first string (key or value) in ``value`` holding a lone surrogate, else
    None. JSON may escape one (``"\\ud800"``); no tokenizer can encode it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    items: Any = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        here = f"{path}.{key}" if isinstance(key, str) else f"{path}[{key}]"
        found = _lone_surrogate(key, here) if isinstance(key, str) else None
        found = found if found is not None else _lone_surrogate(item, here)
        if found is not None:
            return found.lstrip(".")
    return None


def _merge_extra_body(data: dict[str, Any], null_fields: frozenset[str]) -> dict[str, Any]:
    nested = data["extra_body"]
    if nested is None:
        nested = {}
    if not isinstance(nested, dict):
        raise ValueError("extra_body must be a JSON object of extension fields, e.g. {\"enable_thinking\": false}")
    merged = dict(nested)
    for key, value in data.items():
        if key == "extra_body" or (value is None and key not in null_fields and merged.get(key) is not None):
            continue  # a top-level null is "not given": the nested value stands
        merged[key] = value
    return merged


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
    decoding (``swiftlm.server.structured_mapping``)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class StreamOptions(_Request):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False  # vLLM: usage on every chunk


def _check_template_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(kwargs))
    if reserved:
        raise ValueError(f"{', '.join(reserved)} cannot be set through chat_template_kwargs")
    if "enable_thinking" in kwargs and not (isinstance(kwargs["enable_thinking"], bool | None)
                                            or kwargs["enable_thinking"] == "auto"):
        raise ValueError('enable_thinking must be true, false or "auto"')
    return kwargs


# ---------------------------------------------------------------- requests


class BaseSamplingRequest(_Request):
    """Fields shared by chat and legacy completions: sampling, stopping, streaming, extensions.

    ``temperature``, ``top_p``, ``top_k``, ``min_p`` and ``repetition_penalty`` left out fall back
    to the checkpoint's generation_config.json. ``top_k`` of -1 or 0 disables it.
    ``use_cache`` is accepted and changes nothing: prefix caching is always on and never changes
    results. ``clean_up_tokenization_spaces`` is accepted and changes nothing: Qwen3's tokenizer
    does not clean up spaces (its tokenizer_config says false), and swiftlm never does.
    ``best_of`` may be null, 1 or ``n`` (all of them the n samples returned); any other value is
    an error: vLLM's V1 engine dropped it, and swiftlm never generates samples it does not return.
    """

    reads_extra_body: ClassVar[bool] = True

    model: StrictStr | None = None
    n: _int(ge=1) = 1
    temperature: _float(ge=0.0, le=2.0) | None = None
    top_p: _float(gt=0.0, le=1.0) | None = None
    top_k: _int(ge=-1) | None = None
    min_p: _float(ge=0.0, le=1.0) | None = None
    repetition_penalty: _float(gt=0.0) | None = None
    presence_penalty: _float(ge=-2.0, le=2.0) = 0.0
    frequency_penalty: _float(ge=-2.0, le=2.0) = 0.0
    logit_bias: Annotated[dict[str, _float(ge=-100.0, le=100.0)], Field(max_length=MAX_LOGIT_BIAS)] | None = None
    seed: _int(ge=-(2**63), le=2**64 - 1) | None = None
    max_tokens: _int(ge=1) | None = None
    max_new_tokens: _int(ge=1) | None = None  # extension: alias of max_tokens (HF's name)
    min_tokens: _int(ge=0) = 0
    stop: Stop = Field(default_factory=list)
    stop_token_ids: list[TokenId] = Field(default_factory=list)
    include_stop_str_in_output: StrictBool = False
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    stream: StrictBool = False
    stream_options: StreamOptions | None = None  # honoured only when stream is true
    user: StrictStr | None = None
    session_id: Id | None = None
    request_id: Id | None = None
    priority: _int(ge=-(2**31), le=2**31 - 1) = 0  # vLLM's: lower is served earlier (--scheduling-policy priority)
    use_cache: StrictBool | None = None
    cache: StrictBool | None = None  # false: not answered from, nor stored in, the response cache
    clean_up_tokenization_spaces: StrictBool | None = None
    best_of: _int(ge=1) | None = None
    prompt_logprobs: _int(ge=0, le=MAX_TOP_LOGPROBS) | None = None  # vLLM's: score the prompt too
    # swiftlm's, on a server started with --speculative-config: 0 turns speculation off for this
    # request, k caps its draft length at k (at most the server's); left out: the server's
    num_speculative_tokens: _int(ge=0) | None = None
    # structured output (swiftlm.server.structured_mapping): vLLM's fields, llama.cpp's GBNF grammar
    guided_json: dict[str, Any] | StrictStr | None = None
    guided_regex: StrictStr | None = None
    guided_choice: list[StrictStr] | None = None
    guided_grammar: StrictStr | None = None
    structured_outputs: dict[str, Any] | None = None
    grammar: StrictStr | None = None

    @model_validator(mode="after")
    def _prompt_logprobs_not_streamed(self) -> BaseSamplingRequest:
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs are not available with stream: true (as in vLLM); send stream: false")
        return self

    @model_validator(mode="after")
    def _best_of_is_n(self) -> BaseSamplingRequest:
        if self.best_of is not None and self.best_of not in (1, self.n):
            raise ValueError(
                f"best_of {self.best_of} is not supported (vLLM's V1 engine dropped it): leave it out, or set it "
                f"to n ({self.n}); to choose among samples, ask for n samples with logprobs and pick on the client"
            )
        return self


class ChatCompletionRequest(BaseSamplingRequest):
    """POST /v1/chat/completions.

    Length limit precedence: max_completion_tokens > max_tokens > max_new_tokens > the server's
    default (see request_mapping). ``top_logprobs`` (0..20) requires ``logprobs: true``.
    Thinking: top-level ``enable_thinking`` > ``chat_template_kwargs.enable_thinking`` >
    ``reasoning_effort`` > the server's default template kwargs > ``--default-thinking`` > on (the
    table is ``swiftlm.core.generation.resolve_thinking_choice``'s); "auto" leaves the decision
    to the server's rule set (``swiftlm.text.thinking_rules``). ``cache: false``: not answered from
    nor stored in the response cache (``swiftlm.server.response_cache``). ``return_reasoning: false`` drops the reasoning
    from the response (it is still generated unless thinking is off); ``thinking_budget`` (vLLM's
    name: ``thinking_token_budget``, an alias; sending both with different values is an error)
    caps the reasoning tokens, else ``reasoning_effort``'s default budget does
    (``swiftlm.core.generation.REASONING_EFFORT_BUDGETS``). ``tools`` are rendered into the
    prompt and the calls parsed from the answer; ``tool_choice`` "none" leaves them out, and
    "required" or a named function are enforced by constrained decoding; ``parallel_tool_calls:
    false`` allows one call (``swiftlm.server.tool_choice``). ``session_reset: true`` starts
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


class TokenizeRequest(_Request):
    """POST /tokenize: either ``prompt`` (text) or ``messages`` (rendered with the chat template).

    ``add_special_tokens`` defaults to true for a prompt and false for messages (vLLM's defaults;
    the template already writes the special tokens)."""

    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_generation_prompt: StrictBool = True
    add_special_tokens: StrictBool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    enable_thinking: ThinkingSwitch = None  # "auto": the server's rule set decides
    reasoning_effort: ReasoningEffort | None = None
    tools: list[Tool] | None = None
    return_token_strs: StrictBool = False

    reads_extra_body: ClassVar[bool] = True

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else _check_template_kwargs(value)

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send either prompt or messages (exactly one)")
        return self


class DetokenizeRequest(_Request):
    model: StrictStr | None = None
    tokens: list[TokenId]


# ---------------------------------------------------------------- responses


class _Response(BaseModel):
    """Base of response models: ``always_present`` fields are written as null even when the
    dump uses exclude_none (OpenAI clients expect them)."""

    always_present: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _keep_nulls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for name in self.always_present:
            if name not in data and getattr(self, name) is None:
                data[name] = None
        return data


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(_Response):
    content: list[TokenLogprob] | None = None


class PromptTokensDetails(_Response):
    cached_tokens: int = 0


class CompletionTokensDetails(_Response):
    reasoning_tokens: int = 0


class UsageInfo(_Response):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None

    @classmethod
    def of(
        cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0, reasoning_tokens: int = 0
    ) -> UsageInfo:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
            completion_tokens_details=CompletionTokensDetails(reasoning_tokens=reasoning_tokens),
        )


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


class PromptLogprob(_Response):
    """One token of a ``prompt_logprobs`` entry, as vLLM writes it (``rank``: 1 = most likely;
    null for a prompt token outside the top k, whose exact rank is not computed)."""

    logprob: float
    rank: int | None = None
    decoded_token: str


# vLLM's prompt_logprobs: per prompt token, None (the first) or {token id: PromptLogprob}
PromptLogprobs = list[dict[int, PromptLogprob] | None]


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


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "swiftlm"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(default_factory=list)


class TokenizeResponse(_Response):
    tokens: list[int]
    count: int
    max_model_len: int
    token_strs: list[str] | None = None


class DetokenizeResponse(_Response):
    prompt: str


class ErrorDetail(_Response):
    message: str
    type: str  # "invalid_request_error", "rate_limit_exceeded", "service_unavailable", ...
    param: str | None
    code: str | int | None


class ErrorResponse(_Response):
    """Every error the server answers (``swiftlm.server.errors``): OpenAI's envelope."""

    error: ErrorDetail


class HealthStatus(_Response):
    """GET /health: "ok" (200), or "loading", "unavailable" or "failed" (503, with ``error``)."""

    status: Literal["ok", "loading", "unavailable", "failed"]
    error: str | None = None


class SessionDeleted(_Response):
    id: str
    object: Literal["session"] = "session"
    deleted: bool
