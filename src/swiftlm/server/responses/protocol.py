"""The Responses API's wire protocol (POST /v1/responses and the stored responses' routes).

Requests are strict where chat's are lenient: a field or an item type this server does not
support is a 400 that names it (``extra="forbid"`` on every request model, and the item and tool
types checked by name), because the Responses API carries features (hosted tools, encrypted
reasoning, conversations) that would change the answer if they were dropped silently. Fields that
change nothing here are accepted: ``user``, ``safety_identifier``, ``prompt_cache_key`` (prefix
caching is always on), ``service_tier`` "auto"/"default", ``truncation`` "disabled", ``background``
false, ``include`` [], ``reasoning.summary`` (the thinking is returned whole as the reasoning item's
``content``; its ``summary`` stays empty), ``stream_options.include_obfuscation`` (events carry no
obfuscation padding). Extensions, as on chat: ``enable_thinking``, ``chat_template_kwargs``,
``top_k``, ``seed``, ``num_speculative_tokens``, ``cache`` (top-level or nested in ``extra_body``).

What the server answers: ``swiftlm.server.responses.objects``.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from swiftlm.server.protocol import (
    Id,
    ReasoningEffort,
    _check_template_kwargs,
    _float,
    _int,
    _Request,
)

MAX_METADATA_KEYS = 16
INPUT_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
Status = Literal["in_progress", "completed", "incomplete"]


class _Strict(_Request):
    """A request part whose unknown fields are a 400 naming them."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# ---------------------------------------------------------------- input items


class InputText(_Strict):
    """Text content of a message: ``input_text`` (sent), ``output_text`` (an earlier answer sent
    back; its annotations and logprobs are output metadata and change nothing)."""

    type: Literal["input_text", "output_text"]
    text: StrictStr
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


def _only_types(value: Any, allowed: tuple[str, ...], what: str, supported: str) -> Any:
    """``value`` as it is, unless it is a list with an entry whose ``type`` is not in ``allowed``."""
    if isinstance(value, list):
        for i, entry in enumerate(value):
            kind = entry.get("type") if isinstance(entry, dict) else None
            if kind not in allowed:
                raise ValueError(f"{what} {i} has type {kind!r}; {supported}")
    return value


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    id: Id | None = None
    role: Literal["user", "system", "developer", "assistant"]
    content: StrictStr | list[InputText]
    status: Status | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        return _only_types(value, ("input_text", "output_text"), "content part",
                           "only 'input_text' and 'output_text' parts are supported (the models served are text-only)")


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    id: Id | None = None
    call_id: Id
    name: StrictStr
    arguments: StrictStr
    status: Status | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    id: Id | None = None
    call_id: Id
    output: StrictStr | list[InputText]
    status: Status | None = None


class ReasoningText(_Strict):
    type: Literal["reasoning_text", "summary_text"]
    text: StrictStr


class ReasoningItem(_Strict):
    """Earlier thinking sent back: the template may show it to the model with the answer after it."""

    type: Literal["reasoning"]
    id: Id | None = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    status: Status | None = None


InputItem = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem, Field(discriminator="type")
]


_ITEMS: TypeAdapter[list[Any]] = TypeAdapter(list[InputItem])


def _check_items(value: Any) -> Any:
    """A message item may leave out its ``type`` (OpenAI's "easy" input message); any other type
    than the supported ones is named in the 400."""
    if not isinstance(value, list):
        return value
    if not value:
        raise ValueError("input is an empty list; send at least one item (or a string)")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, dict) and "type" not in item and "role" in item:
            item = {**item, "type": "message"}
        kind = item.get("type") if isinstance(item, dict) else None
        if isinstance(item, dict) and kind not in INPUT_ITEM_TYPES:
            raise ValueError(
                f"input item {i} has type {kind!r}, which this server does not support; supported: "
                + ", ".join(INPUT_ITEM_TYPES)
            )
        out.append(item)
    try:
        return _ITEMS.validate_python(out)
    except ValidationError as exc:  # one message naming the item's field, not one per member of the union
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"] if p not in INPUT_ITEM_TYPES)
        raise ValueError(f"item {where}: {str(first['msg']).removeprefix('Value error, ')}") from None


# ---------------------------------------------------------------- tools and formats


class FunctionTool(_Strict):
    type: Literal["function"]
    name: StrictStr
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class FunctionToolChoice(_Strict):
    type: Literal["function"]
    name: StrictStr


class TextFormat(_Strict):
    """``text`` (no constraint), ``json_object``, or ``json_schema`` with ``name`` and ``schema``:
    enforced by constrained decoding, as chat's ``response_format``."""

    type: Literal["text", "json_object", "json_schema"]
    name: StrictStr | None = None
    description: StrictStr | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class TextConfig(_Strict):
    format: TextFormat | None = None


class ReasoningConfig(_Strict):
    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesStreamOptions(_Strict):
    include_obfuscation: StrictBool | None = None


class ResponsesRequest(_Strict):
    """POST /v1/responses (see the module docstring for what is accepted and what is refused).

    ``input``: a string (one user message) or a list of input items. ``instructions``: a system
    message before the conversation (not carried over by ``previous_response_id``, as in OpenAI).
    ``previous_response_id``: continue that stored response's conversation with this input.
    ``store`` (default true): keep the response for GET, input_items and later turns.
    """

    reads_extra_body: ClassVar[bool] = True

    model: StrictStr | None = None
    input: StrictStr | Annotated[list[InputItem], Field(min_length=1)]
    instructions: StrictStr | None = None
    previous_response_id: Id | None = None
    max_output_tokens: _int(ge=1) | None = None
    temperature: _float(ge=0.0, le=2.0) | None = None
    top_p: _float(gt=0.0, le=1.0) | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    store: StrictBool = True
    metadata: Annotated[dict[str, Annotated[StrictStr, Field(max_length=512)]], Field(max_length=MAX_METADATA_KEYS)] | None = None
    stream: StrictBool = False
    stream_options: ResponsesStreamOptions | None = None
    user: StrictStr | None = None
    safety_identifier: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None
    service_tier: Literal["auto", "default"] | None = None
    truncation: Literal["disabled"] | None = None
    background: Literal[False] | None = None
    include: Annotated[list[StrictStr], Field(max_length=0)] | None = None
    # extensions (as on chat)
    enable_thinking: StrictBool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    top_k: _int(ge=-1) | None = None
    seed: _int(ge=-(2**63), le=2**64 - 1) | None = None
    num_speculative_tokens: _int(ge=0) | None = None  # as on chat: 0 off, k caps the draft (--speculative-config)
    cache: StrictBool | None = None  # as on chat: false keeps this request out of the response cache

    @field_validator("input", mode="before")
    @classmethod
    def _supported_items(cls, value: Any) -> Any:
        return _check_items(value)

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools_only(cls, value: Any) -> Any:
        return _only_types(value, ("function",), "tool", "only function tools are supported")

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else _check_template_kwargs(value)
