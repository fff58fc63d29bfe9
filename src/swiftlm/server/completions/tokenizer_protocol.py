"""The tokenizer endpoints' wire protocol (vLLM's POST /tokenize and /detokenize): a prompt, or chat
messages rendered with the chat template as a chat request would be.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field, StrictBool, StrictStr, field_validator, model_validator

from swiftlm.server.completions.chat_protocol import ChatMessage, Tool
from swiftlm.server.protocol import (
    ReasoningEffort,
    ThinkingSwitch,
    TokenId,
    _check_template_kwargs,
    _Request,
    _Response,
)


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


class TokenizeResponse(_Response):
    tokens: list[int]
    count: int
    max_model_len: int
    token_strs: list[str] | None = None


class DetokenizeResponse(_Response):
    prompt: str
