"""From a validated request to engine inputs: SamplingParams, chat-template inputs, prompts.

Pure functions, no FastAPI. Problems a client caused raise ``OpenAIError`` (400) with a message
that says what to change.

Decisions:

- Length limit, chat: ``max_completion_tokens`` (OpenAI's current name) > ``max_tokens`` (its
  deprecated name, still sent by many clients) > ``max_new_tokens`` (extension, HF's name) >
  ``default_max_tokens`` (the server's; typically the context left after the prompt). Legacy
  completions: ``max_tokens`` if the client sent a number > ``max_new_tokens`` > ``max_tokens:
  null`` sent explicitly means ``default_max_tokens`` > 16 (OpenAI's default).
- Sampling fields the request leaves out (temperature, top_p, top_k, min_p,
  repetition_penalty) take the checkpoint's generation_config.json values, as vLLM does; then
  SamplingParams' defaults. ``top_k: -1`` becomes 0 (disabled).
- Empty stop strings are dropped (they cannot mean anything).
- ``developer`` messages are rendered as ``system``: OpenAI's newer name for the same thing.
  Qwen3's template has no ``developer`` role (it would drop the message silently).
- Thinking: decided by ``swiftlm.core.generation.resolve_thinking_choice`` (its docstring holds the
  precedence table); ``thinking_choice`` only hands it the request's fields, the server's
  defaults and, for "auto", the rule set (``swiftlm.text.thinking_rules``) over the last user message. The thinking budget:
  ``thinking_budget`` (or its alias ``thinking_token_budget``) > ``reasoning_effort``'s default
  budget > none (``resolve_thinking_budget``).
- ``tool_choice: "none"`` leaves the tools out of the prompt, so the model is not offered them.
- Structured output (``response_format``, vLLM's ``guided_*`` / ``structured_outputs``, llama.cpp's
  ``grammar``): ``swiftlm.server.completions.structured_mapping``, compiled and checked here (400 if bad).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from swiftlm.core.generation import ThinkingChoice, resolve_thinking_budget, resolve_thinking_choice
from swiftlm.sampling import SamplingParams
from swiftlm.server.completions.chat_protocol import ChatCompletionRequest, ChatMessage
from swiftlm.server.completions.completion_protocol import CompletionRequest
from swiftlm.server.completions.sampling_protocol import BaseSamplingRequest
from swiftlm.server.completions.structured_mapping import structured_output
from swiftlm.server.completions.tokenizer_protocol import TokenizeRequest
from swiftlm.server.errors import OpenAIError, bad_request
from swiftlm.text.thinking_rules import ThinkingRules, last_user_text

DEFAULT_MAX_N = 16
OPENAI_DEFAULT_COMPLETION_MAX_TOKENS = 16
_GENERATION_DEFAULT_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def chat_max_tokens(req: ChatCompletionRequest, default_max_tokens: int | None) -> int | None:
    for value in (req.max_completion_tokens, req.max_tokens, req.max_new_tokens):
        if value is not None:
            return value
    return default_max_tokens


def completion_max_tokens(req: CompletionRequest, default_max_tokens: int | None) -> int | None:
    if req.max_tokens is not None and "max_tokens" in req.model_fields_set:
        return req.max_tokens
    if req.max_new_tokens is not None:
        return req.max_new_tokens
    if req.max_tokens is None:  # sent as null
        return default_max_tokens
    return req.max_tokens


def sampling_params_from_chat(
    req: ChatCompletionRequest,
    default_max_tokens: int | None,
    generation_defaults: Mapping[str, Any] | None,
    *,
    max_n: int = DEFAULT_MAX_N,
) -> SamplingParams:
    """SamplingParams for a chat request. ``logprobs: true`` gives ``top_logprobs`` (or 0) top
    tokens per step; false gives none."""
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    return _sampling_params(
        req,
        chat_max_tokens(req, default_max_tokens),
        logprobs,
        generation_defaults,
        max_n,
        thinking_budget=resolve_thinking_budget(req.thinking_budget, req.reasoning_effort),
        prompt_logprobs=req.prompt_logprobs,
    )


def sampling_params_from_completion(
    req: CompletionRequest,
    default_max_tokens: int | None,
    generation_defaults: Mapping[str, Any] | None,
    *,
    max_n: int = DEFAULT_MAX_N,
) -> SamplingParams:
    """SamplingParams for a legacy completion request (``logprobs`` is already a count). The
    prompt is scored (``prompt_logprobs``) for ``echo`` with ``logprobs`` and for vLLM's
    ``prompt_logprobs``, with the larger of the two counts (each is cut to its own on output)."""
    max_tokens = completion_max_tokens(req, default_max_tokens)
    wanted = [k for k in (req.logprobs if req.echo else None, req.prompt_logprobs) if k is not None]
    return _sampling_params(
        req, max_tokens, req.logprobs, generation_defaults, max_n,
        prompt_logprobs=max(wanted) if wanted else None,
    )


def _sampling_params(
    req: BaseSamplingRequest,
    max_tokens: int | None,
    logprobs: int | None,
    generation_defaults: Mapping[str, Any] | None,
    max_n: int,
    thinking_budget: int | None = None,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    if req.n > max_n:
        raise bad_request(f"n {req.n} exceeds this server's maximum of {max_n}", param="n")
    overrides = {name: value for name in _GENERATION_DEFAULT_FIELDS if (value := getattr(req, name)) is not None}
    if overrides.get("top_k") == -1:
        overrides["top_k"] = 0
    structured = structured_output(req)
    try:
        return SamplingParams.from_generation_config(
            dict(generation_defaults or {}),
            n=req.n,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            stop=tuple(s for s in req.stop if s),
            stop_token_ids=tuple(req.stop_token_ids),  # checked against the vocabulary with the rest (``validate``)
            include_stop_str_in_output=req.include_stop_str_in_output,
            ignore_eos=req.ignore_eos,
            seed=req.seed,
            logprobs=logprobs,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            logit_bias=logit_bias_ids(req.logit_bias),
            skip_special_tokens=req.skip_special_tokens,
            thinking_budget=thinking_budget,
            prompt_logprobs=prompt_logprobs,
            structured_outputs=structured,
            num_speculative_tokens=req.num_speculative_tokens,
            **overrides,
        )
    except ValueError as exc:
        raise bad_request(str(exc)) from exc


def logit_bias_ids(logit_bias: Mapping[str, float] | None) -> dict[int, float]:
    """OpenAI's ``{"token id as a string": bias}`` as ``{token_id: bias}`` (whether each id is in the
    vocabulary is checked with the rest of the request, ``swiftlm.engine.validation``)."""
    out: dict[int, float] = {}
    for key, bias in (logit_bias or {}).items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise bad_request(
                f"logit_bias key {key!r} is not a token id; keys are token ids written as decimal strings, e.g. \"1234\"",
                param="logit_bias",
            )
        out[int(key)] = float(bias)
    return out


def check_token_ids(token_ids: Sequence[int], vocab_size: int | None, param: str) -> Sequence[int]:
    """``token_ids`` unchanged, after checking each is in ``[0, vocab_size)``."""
    if vocab_size is not None:
        for token_id in token_ids:
            if not 0 <= token_id < vocab_size:
                raise bad_request(
                    f"{param} contains token id {token_id}, outside the vocabulary of {vocab_size} tokens "
                    f"(ids 0 to {vocab_size - 1})",
                    param=param,
                )
    return token_ids


MAX_CHARS_PER_TOKEN = 32  # a prompt longer than this many characters a context token cannot fit


def check_prompt_chars(texts: Sequence[str], max_model_len: int, param: str) -> None:
    """A 400 before tokenising a prompt whose text could not fit the context window (tokenising
    megabytes takes seconds): more than ``MAX_CHARS_PER_TOKEN`` characters per token of room."""
    chars = sum(len(t) for t in texts)
    if chars > max_model_len * MAX_CHARS_PER_TOKEN:
        raise OpenAIError(
            400, f"the prompt has {chars} characters, more than the context window of {max_model_len} tokens can "
                 "hold; shorten it", param=param, code="context_length_exceeded",
        )


# ---------------------------------------------------------------- chat template inputs


def chat_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Plain dicts for the chat template: text parts joined with "\\n", ``developer`` as
    ``system``, null content as "", ``reasoning`` as ``reasoning_content``, nulls left out."""
    out = []
    for message in messages:
        content = message.content
        if isinstance(content, list):
            content = "\n".join(part.text for part in content)
        plain: dict[str, Any] = {
            "role": "system" if message.role == "developer" else message.role,
            "content": content or "",
        }
        if message.name is not None:
            plain["name"] = message.name
        if message.tool_calls:
            plain["tool_calls"] = [call.model_dump(exclude_none=True) for call in message.tool_calls]
        if message.tool_call_id is not None:
            plain["tool_call_id"] = message.tool_call_id
        reasoning = message.reasoning_content if message.reasoning_content is not None else message.reasoning
        if reasoning is not None:
            plain["reasoning_content"] = reasoning
        out.append(plain)
    return out


def template_tools(req: ChatCompletionRequest | TokenizeRequest) -> list[dict[str, Any]] | None:
    """Tool definitions for the template, or None (no tools, or ``tool_choice: "none"``)."""
    if not req.tools or getattr(req, "tool_choice", None) == "none":
        return None
    return [tool.model_dump(exclude_none=True) for tool in req.tools]


def thinking_choice(
    req: ChatCompletionRequest | TokenizeRequest,
    server_default_kwargs: Mapping[str, Any] | None,
    can_think: bool = True,
    *,
    default_thinking: str | None = None,
    rules: ThinkingRules | None = None,
    messages: list[dict[str, Any]] | None = None,
) -> ThinkingChoice:
    """The request's thinking fields in ``resolve_thinking_choice``'s rows; ``can_think``: the
    tokenizer has think tokens; ``rules`` decide "auto" from the last user message of
    ``messages`` (the whole conversation, a session's transcript included)."""
    decide = None
    if rules is not None:
        def decide() -> bool:
            return rules.decide(last_user_text(messages or [])).thinking
    try:
        return resolve_thinking_choice(
            enable_thinking=req.enable_thinking,
            template_kwargs=req.chat_template_kwargs,
            reasoning_effort=req.reasoning_effort,
            default_template_kwargs=server_default_kwargs,
            default_thinking=default_thinking,
            decide_auto=decide,
            can_think=can_think,
        )
    except ValueError as exc:
        raise bad_request(str(exc), param="enable_thinking") from exc


def thinking_enabled(
    req: ChatCompletionRequest | TokenizeRequest,
    server_default_kwargs: Mapping[str, Any] | None,
    can_think: bool = True,
    **auto: Any,
) -> bool:
    """``thinking_choice(...).thinking``."""
    return thinking_choice(req, server_default_kwargs, can_think, **auto).thinking


def template_kwargs(
    req: ChatCompletionRequest | TokenizeRequest, server_defaults: Mapping[str, Any] | None, thinking: bool
) -> dict[str, Any]:
    """The server's default chat_template_kwargs, updated with the request's, with
    ``enable_thinking`` set to ``thinking``, the value resolved for the request."""
    return {**(server_defaults or {}), **(req.chat_template_kwargs or {}), "enable_thinking": thinking}


# ---------------------------------------------------------------- legacy completions


def completion_prompts(req: CompletionRequest) -> list[str | list[int]]:
    """The request's prompts, one entry per prompt: text, or token ids (checked against the vocabulary
    with the rest of the request, ``swiftlm.engine.validation``).
    Choice ``i * n + j`` of the response is sample ``j`` of prompt ``i``."""
    prompt = req.prompt
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif all(isinstance(p, int) for p in prompt):
        prompts = [list(prompt)]
    else:
        prompts = list(prompt)
    for i, p in enumerate(prompts):
        if len(p) == 0:
            which = "the prompt" if len(prompts) == 1 else f"prompt {i}"
            raise bad_request(f"{which} is empty; send at least one token of text", param="prompt")
    return prompts


def request_priority(priority: int, policy: str) -> int:
    """A request's ``priority`` (vLLM's: lower is served earlier), which only the "priority"
    scheduling policy honours; elsewhere a non-zero one is a 400, as in vLLM."""
    if priority and policy != "priority":
        raise bad_request(
            f"priority {priority} needs the priority scheduling policy; this server schedules first come, first "
            "served (start it with --scheduling-policy priority)", param="priority",
        )
    return priority
