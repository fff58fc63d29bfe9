"""The wire protocol's shared pieces: what every API's pydantic models build on.

The models of each API live with it: chat and legacy completions (and the tokenizer endpoints) in
``swiftlm.server.completions`` (``sampling_protocol``, ``chat_protocol``, ``completion_protocol``,
``tokenizer_protocol``), the Responses API in ``swiftlm.server.responses.protocol`` and
``swiftlm.server.responses.objects``, the Files and Batches APIs in ``swiftlm.server.batch.protocol``.
Here: the base request and response models and the strict field types, ``usage``, the error
envelope, and the answers of the server's own routes (models, health, sessions: ``routes/misc.py``).

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
  ``swiftlm.server.completions.request_mapping``, which also turns a request into SamplingParams
  and chat-template inputs.

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
    model_serializer,
    model_validator,
)
from pydantic.types import Strict

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


def _check_template_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(kwargs))
    if reserved:
        raise ValueError(f"{', '.join(reserved)} cannot be set through chat_template_kwargs")
    if "enable_thinking" in kwargs and not (isinstance(kwargs["enable_thinking"], bool | None)
                                            or kwargs["enable_thinking"] == "auto"):
        raise ValueError('enable_thinking must be true, false or "auto"')
    return kwargs


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


class ErrorDetail(_Response):
    message: str
    type: str  # "invalid_request_error", "rate_limit_exceeded", "service_unavailable", ...
    param: str | None
    code: str | int | None


class ErrorResponse(_Response):
    """Every error the server answers (``swiftlm.server.errors``): OpenAI's envelope."""

    error: ErrorDetail


# ---------------------------------------------------------------- the server's own routes (routes/misc.py)


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


class HealthStatus(_Response):
    """GET /health: "ok" (200), or "loading", "unavailable" or "failed" (503, with ``error``)."""

    status: Literal["ok", "loading", "unavailable", "failed"]
    error: str | None = None


class SessionDeleted(_Response):
    id: str
    object: Literal["session"] = "session"
    deleted: bool
