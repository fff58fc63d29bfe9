"""Render a model's own Jinja chat template the way Hugging Face transformers renders it.

The environment mirrors transformers' `apply_chat_template`: a sandboxed, immutable Jinja
environment with `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `tojson`
filter that does not escape HTML or non-ASCII characters, and the globals `raise_exception` and
`strftime_now`. For inputs transformers accepts, the output is byte-identical.

Message normalisation (done before rendering, on a copy; the caller's messages are not touched):

- Keys whose value is None are dropped, as transformers does (OpenAI clients send `tool_calls=None`).
- Exception: `content=None` (an OpenAI assistant message that only carries tool calls) becomes
  `""`. transformers drops the key, and Qwen3's template then fails on the undefined content; with
  `""` the output equals what transformers renders for `content=""`.
- `content` given as a list of OpenAI content parts is joined into one string: the `text` of each
  `{"type": "text", "text": ...}` part, separated by "\\n" (vLLM's convention for text-only
  templates). Other part types (images, audio) are rejected with ChatTemplateError.
- Reasoning given as `reasoning` or `thinking` also fills `reasoning_content` (and `thinking` is
  filled from `reasoning_content`), as transformers does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """The chat template rejected the conversation, or the conversation is malformed."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template error: {message}")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML; chat templates need plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _plain(value: Any) -> Any:
    """A deep copy made of plain JSON types, so the template sees no caller objects."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if callable(getattr(value, "model_dump", None)):  # pydantic models (OpenAI SDK message objects)
        return _plain(value.model_dump())
    raise ChatTemplateError(f"unsupported value of type {type(value).__name__} in chat input")


def _join_text_parts(parts: list[Any], role: str) -> str:
    texts = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type", "text") == "text" and "text" in part:
            texts.append(part["text"])
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ChatTemplateError(
                f"a {role} message has a content part of type {kind!r}; only text parts are supported"
            )
    return "\n".join(texts)


def normalize_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Plain-dict copies of `messages`, normalised as described in the module docstring."""
    if not messages:
        raise ChatTemplateError("the conversation is empty; send at least one message")
    out = []
    for i, raw in enumerate(messages):
        message = _plain(raw)
        if not isinstance(message, dict):
            raise ChatTemplateError(f"message {i} is not an object with 'role' and 'content'")
        if "role" not in message:
            raise ChatTemplateError(f"message {i} has no 'role'")
        if "content" in message and message["content"] is None:
            message["content"] = ""
        message = {k: v for k, v in message.items() if v is not None}
        if isinstance(message.get("content"), list):
            message["content"] = _join_text_parts(message["content"], message["role"])
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def _make_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template.

    `special_tokens` are the tokenizer's special token strings (e.g. {"eos_token": "<|im_end|>"});
    they are passed to the template as variables, and keyword arguments given to `render` override
    them, as in transformers. Tokens that are None are not passed (the template sees them undefined).
    """

    def __init__(self, template: str, special_tokens: Mapping[str, str | None] | None = None) -> None:
        self.source = template
        self._special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        try:
            self._template = _make_environment().from_string(template)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"the chat template does not compile: {exc}") from exc

    def render(
        self,
        messages: Sequence[Any],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text for `messages`; `template_kwargs` (e.g. enable_thinking) reach the template."""
        variables = {**self._special_tokens, **_plain(template_kwargs)}
        try:
            return self._template.render(
                messages=normalize_messages(messages),
                tools=_plain(tools),
                documents=_plain(documents),
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"the chat template failed on this conversation: {exc}") from exc
