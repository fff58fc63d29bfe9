"""The input processor: a caller's input -> the engine's request, checked once.

Every front end forms its requests here: the server's chat and completions routes (and the
Responses and Batch APIs, which run through them), ``LLM.generate`` / ``LLM.chat`` and the CLI (on
``LLM``). What differs between APIs is only how their fields map onto these arguments (the
server's ``completions.request_mapping``, ``tool_choice``, ``structured_mapping``: an API's wire
format stays in its room of the server); a chat turn (``chat_turn``: the conversation with a
session's transcript, the thinking decision, the chat template over a session's real token stream,
the tools, the length left in the context window, a tool constraint, an automatic thinking budget),
the tokenising of a text prompt and the one validation against the engine (``Engine.validate``)
are the same code for all of them. Whatever a caller must change is a ``RequestError`` naming the
field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from swiftlm.core.generation import GenerationRequest, ThinkingChoice, resolve_thinking_choice
from swiftlm.core.structured import StructuredOutput
from swiftlm.engine.validation import RequestError
from swiftlm.sampling import SamplingParams
from swiftlm.text.chat_template import ChatTemplateError
from swiftlm.text.session_prompt import SessionPrompts
from swiftlm.text.thinking_rules import ThinkingRules, last_user_text
from swiftlm.text.tokenizer import Tokenizer

Validate = Callable[[Sequence[int], SamplingParams], None]  # raises RequestError (``Engine.validate``)


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """A rendered conversation: the prompt's text and token ids (extending the session's real token
    stream where there is one) and whether it opens a reasoning section."""

    text: str
    token_ids: list[int]
    thinking: bool


@dataclass(frozen=True, slots=True)
class ChatDefaults:
    """What a front end fills in where a chat turn leaves it open: the server's flags (``LLM``: none)."""

    template_kwargs: Mapping[str, Any] | None = None  # --default-chat-template-kwargs
    thinking: str | None = None  # --default-thinking
    thinking_rules: ThinkingRules | None = None  # how "auto" decides (--thinking-rules)
    auto_thinking_budget: int | None = None  # the budget of a turn "auto" turned thinking on for


@dataclass(frozen=True, slots=True)
class ChatInput:
    """One chat turn as an API states it, its fields mapped onto the engine's terms."""

    messages: list[dict[str, Any]]  # the new messages, plain dicts for the chat template
    params: SamplingParams  # max_tokens None: up to the end of the context window
    enable_thinking: bool | str | None = None  # the top-level switch (True, False, "auto")
    template_kwargs: Mapping[str, Any] | None = None  # the request's chat_template_kwargs
    reasoning_effort: str | None = None
    tools: list[dict[str, Any]] | None = None  # offered in the prompt
    tool_constraint: StructuredOutput | None = None  # the answer must be tool calls (tool_choice)
    session_id: str | None = None
    session_reset: bool = False


@dataclass(frozen=True, slots=True)
class PreparedChat:
    """A chat turn ready for the engine: its request, and what recording the turn needs afterwards."""

    request: GenerationRequest
    messages: list[dict[str, Any]]  # the whole conversation (a session's transcript + the new messages)
    tools: list[dict[str, Any]] | None
    thinking: ThinkingChoice


class InputProcessor:
    def __init__(self, tokenizer: Tokenizer, session_prompts: SessionPrompts, validate: Validate,
                 max_model_len: int, chat_defaults: ChatDefaults | None = None) -> None:
        self.tokenizer = tokenizer
        self.session_prompts = session_prompts
        self._validate = validate
        self.max_model_len = max_model_len
        self.chat_defaults = chat_defaults or ChatDefaults()

    def chat_turn(self, request_id: str, chat: ChatInput, *, stream: bool = False, final_only: bool = False,
                  priority: int = 0, background: bool = False) -> PreparedChat:
        """The engine's request for one chat turn, decided and checked here for every API (see the
        module's docstring). Raises RequestError with the field it is about."""
        messages = self.conversation(chat.session_id, chat.messages, reset=chat.session_reset)
        choice, rendered = self.render(messages, enable_thinking=chat.enable_thinking,
                                       template_kwargs=chat.template_kwargs, reasoning_effort=chat.reasoning_effort,
                                       tools=chat.tools, session_id=chat.session_id)
        params, changes = chat.params, {}
        if params.max_tokens is None:  # what the context window leaves after the prompt (at least 1)
            changes["max_tokens"] = max(self.max_model_len - len(rendered.token_ids), 1)
        if chat.tool_constraint is not None:
            if params.structured_outputs is not None:
                raise RequestError(
                    "tool_choice required or a named function constrains the answer to tool calls, and so does "
                    "response_format (or structured outputs); give one of them", param="tool_choice",
                )
            changes["structured_outputs"] = chat.tool_constraint
        budget = self.chat_defaults.auto_thinking_budget
        if choice.auto and choice.thinking and params.thinking_budget is None and budget is not None:
            changes["thinking_budget"] = budget
        if changes:
            try:
                params = params.with_updates(**changes)
            except ValueError as exc:
                raise RequestError(str(exc)) from exc
        request = self.request(
            request_id, rendered.token_ids, params, prompt=rendered.text, thinking=choice.thinking,
            session_id=chat.session_id, stream=stream, final_only=final_only, priority=priority, background=background,
        )
        return PreparedChat(request, messages, chat.tools, choice)

    def render(self, messages: list[dict[str, Any]], *, enable_thinking: bool | str | None = None,
               template_kwargs: Mapping[str, Any] | None = None, reasoning_effort: str | None = None,
               tools: list[dict[str, Any]] | None = None,
               session_id: str | None = None) -> tuple[ThinkingChoice, ChatPrompt]:
        """A whole conversation's prompt: the thinking decision (the front end's ``ChatDefaults``,
        its rules for "auto"), then the chat template with it. RequestError names the field refused."""
        defaults = self.chat_defaults
        rules = defaults.thinking_rules
        decide = (lambda: rules.decide(last_user_text(messages)).thinking) if rules is not None else None
        try:
            choice = resolve_thinking_choice(
                enable_thinking=enable_thinking, template_kwargs=template_kwargs, reasoning_effort=reasoning_effort,
                default_template_kwargs=defaults.template_kwargs, default_thinking=defaults.thinking,
                decide_auto=decide, can_think=self.tokenizer.think_end_id is not None,
            )
        except ValueError as exc:
            raise RequestError(str(exc), param="enable_thinking") from exc
        kwargs = {**(defaults.template_kwargs or {}), **(template_kwargs or {})}
        try:
            return choice, self.chat(messages, choice.thinking, kwargs, tools, session_id)
        except ChatTemplateError as exc:
            raise RequestError(f"the chat template could not render these messages: {exc}", param="messages") from exc

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
