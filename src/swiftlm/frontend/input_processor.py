"""The input processor: a caller's input -> the engine's request, checked once.

Every front end forms its requests here: the server's chat and completions routes (and the
Responses and Batch APIs, which run through them), ``LLM.generate`` / ``LLM.chat`` and the CLI (on
``LLM``). What differs between APIs is only how their fields map onto these arguments (the
server's ``completions.request_mapping``, ``tool_choice``, ``structured_mapping``); the rendering of a
conversation (chat template, thinking switch, a session's real token stream, tools), the
tokenising of a text prompt and the one validation against the engine (``Engine.validate``) are
the same code for all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from swiftlm.core.generation import GenerationRequest
from swiftlm.sampling import SamplingParams
from swiftlm.text.session_prompt import SessionPrompts
from swiftlm.text.tokenizer import Tokenizer

Validate = Callable[[Sequence[int], SamplingParams], None]  # raises RequestError (``Engine.validate``)


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """A rendered conversation: the prompt's text and token ids (extending the session's real token
    stream where there is one) and whether it opens a reasoning section."""

    text: str
    token_ids: list[int]
    thinking: bool


class InputProcessor:
    def __init__(self, tokenizer: Tokenizer, session_prompts: SessionPrompts, validate: Validate) -> None:
        self.tokenizer = tokenizer
        self.session_prompts = session_prompts
        self._validate = validate

    def conversation(self, session_id: str | None, messages: list[dict[str, Any]],
                     reset: bool = False) -> list[dict[str, Any]]:
        """The whole conversation a request means: with a session, its recorded transcript and the
        new messages (``SessionPrompts.conversation``); without, the messages as sent."""
        return self.session_prompts.conversation(session_id, messages, reset=reset)

    def chat(self, messages: list[dict[str, Any]], thinking: bool, template_kwargs: Mapping[str, Any] | None = None,
             tools: list[dict[str, Any]] | None = None, session_id: str | None = None) -> ChatPrompt:
        """Render a conversation; the template is given ``enable_thinking=thinking`` (the choice,
        resolved before rendering, so the prompt and the request never disagree). Raises
        ChatTemplateError for messages the template cannot render."""
        kwargs = {**(template_kwargs or {}), "enable_thinking": thinking}
        text, ids = self.session_prompts.prompt(session_id, messages, kwargs, tools)
        return ChatPrompt(text, ids, thinking)

    def text(self, prompt: str | Sequence[int]) -> tuple[str | None, list[int]]:
        """A plain prompt's (text, token ids): text is tokenised, token ids are taken as given."""
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        return None, list(prompt)

    def request(self, request_id: str, token_ids: list[int], params: SamplingParams, *, prompt: str | None = None,
                thinking: bool = False, session_id: str | None = None, stream: bool = False,
                final_only: bool = False, priority: int = 0, background: bool = False) -> GenerationRequest:
        """The engine's request, validated: the one check it passes (RequestError, with the field it
        is about). Hand it on with ``validated=True``."""
        self._validate(token_ids, params)
        return GenerationRequest(
            request_id=request_id, prompt_token_ids=token_ids, sampling_params=params, prompt=prompt,
            thinking=thinking, session_id=session_id, stream=stream, final_only=final_only, priority=priority,
            background=background,
        )
