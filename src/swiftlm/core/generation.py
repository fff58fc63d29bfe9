"""GenerationRequest: what a front end (server, ``LLM``, CLI) resolves once, handed to the engine.

The front ends decide everything about a request before it reaches the engine: the prompt's token
ids, the sampling parameters, whether the prompt opens a reasoning section (``resolve_thinking``),
the session key, and how the caller wants its outputs. The engine, ``AsyncEngine`` and the server
state pass this one object along instead of a row of positional values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from swiftlm.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One request, as resolved at the edge.

    ``prompt_token_ids`` is not copied: do not change it after submitting. ``thinking`` is the
    resolved on/off (the prompt opens a reasoning section the model writes first); the engine
    needs it to enforce ``sampling_params.thinking_budget``, the server to split the reasoning from
    the answer. ``stream``: the caller reads output deltas as they come; ``final_only``: the engine
    reports the request once, when it finishes (a caller waiting for the whole answer). None of
    ``arrival_time`` means "when the engine gets it" (``time.monotonic()``). ``priority`` (vLLM's
    meaning, used by the "priority" scheduling policy): a lower value is served earlier, ties in
    arrival order. ``background``: a Batch API line, run only in the room interactive requests
    leave (``SchedulerConfig.background_max_seqs_share`` and ``background_max_tokens_share``).
    """

    request_id: str
    prompt_token_ids: Sequence[int]
    sampling_params: SamplingParams
    prompt: str | None = None
    thinking: bool = False
    session_id: str | None = None
    stream: bool = False
    final_only: bool = False
    arrival_time: float | None = None
    priority: int = 0
    background: bool = False

    def __post_init__(self) -> None:
        if self.stream and self.final_only:
            raise ValueError("a request cannot both stream its outputs and report only the final one")


# OpenAI's reasoning_effort values: whether each turns thinking on, and its default thinking budget
# (reasoning tokens; None: no limit). An explicit thinking_budget wins over these budgets.
REASONING_EFFORT_THINKING: dict[str, bool] = {"none": False, "minimal": False, "low": True, "medium": True, "high": True}
REASONING_EFFORT_BUDGETS: dict[str, int | None] = {"low": 256, "medium": 1024, "high": None}


AUTO = "auto"  # the value of an enable_thinking field that leaves the decision to the server's rule set
DEFAULT_THINKING_CHOICES = ("auto", "on", "off")  # the server's --default-thinking


@dataclass(frozen=True, slots=True)
class ThinkingChoice:
    """What ``resolve_thinking_choice`` decided: ``thinking`` on or off, and whether the server's
    rule set decided it (``auto``). ``label`` is what a response reports: "on", "off", "auto:on"
    or "auto:off"."""

    thinking: bool
    auto: bool = False

    @property
    def label(self) -> str:
        value = "on" if self.thinking else "off"
        return f"auto:{value}" if self.auto else value


def resolve_thinking_choice(
    *,
    enable_thinking: bool | str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    reasoning_effort: str | None = None,
    default_template_kwargs: Mapping[str, Any] | None = None,
    default_thinking: str | None = None,
    decide_auto: Callable[[], bool] | None = None,
    can_think: bool = True,
) -> ThinkingChoice:
    """Whether the prompt opens a reasoning section: the one place this is decided.

    The rows are read top to bottom; the first that decides wins. A field "decides" when it is
    sent and not null. Rows 1, 2, 4 and 5 may hold "auto": then ``decide_auto()`` (the server's
    rule set over the user's last message, ``swiftlm.text.thinking_rules``) decides, and the
    choice is marked ``auto``.

    ====  =========================================================  ==================================
    row   source                                                     front end that fills it
    ====  =========================================================  ==================================
    0     the tokenizer has no think tokens (``can_think`` false):   all (``think_end_id is None``)
          off, whatever was asked
    1     the request's top-level ``enable_thinking``                server (field or ``extra_body``),
          (true, false or "auto")                                    ``LLM.chat``, CLI ``--no-think``
    2     the request's ``chat_template_kwargs.enable_thinking``     server, ``LLM.chat``
          (true, false or "auto")
    3     the request's ``reasoning_effort``: "none" / "minimal"     server (field or ``extra_body``)
          off; "low" / "medium" / "high" on (their default
          budgets: ``resolve_thinking_budget``)
    4     the server's default chat_template_kwargs                  server
          (``--default-chat-template-kwargs``)
    5     the server's default (``--default-thinking``: "auto",      server
          "on" or "off")
    6     on (Qwen3's default)                                       all
    ====  =========================================================  ==================================

    Every row is resolved before the chat template renders, and the template is given the result
    as ``enable_thinking`` (a bool: Qwen3's template would read the string "auto" as true), so the
    prompt and this value never disagree.
    """
    if not can_think:
        return ThinkingChoice(False)
    for value in (
        enable_thinking,
        template_kwargs.get("enable_thinking") if template_kwargs else None,
    ):
        if value is not None:
            return _choice(value, decide_auto)
    if reasoning_effort is not None:
        if reasoning_effort not in REASONING_EFFORT_THINKING:
            raise ValueError(
                f"reasoning_effort must be one of {', '.join(REASONING_EFFORT_THINKING)}, got {reasoning_effort!r}"
            )
        return ThinkingChoice(REASONING_EFFORT_THINKING[reasoning_effort])
    if default_template_kwargs and default_template_kwargs.get("enable_thinking") is not None:
        return _choice(default_template_kwargs["enable_thinking"], decide_auto)
    if default_thinking is not None:
        if default_thinking not in DEFAULT_THINKING_CHOICES:
            raise ValueError(f"default_thinking must be one of {', '.join(DEFAULT_THINKING_CHOICES)}, "
                             f"got {default_thinking!r}")
        return _choice(AUTO if default_thinking == AUTO else default_thinking == "on", decide_auto)
    return ThinkingChoice(True)


def _choice(value: bool | str, decide_auto: Callable[[], bool] | None) -> ThinkingChoice:
    if value == AUTO:
        if decide_auto is None:
            raise ValueError('enable_thinking "auto" needs a rule set to decide by; this front end has none '
                             "(send true or false)")
        return ThinkingChoice(bool(decide_auto()), auto=True)
    if isinstance(value, str):
        raise ValueError(f'enable_thinking must be true, false or "auto", got {value!r}')
    return ThinkingChoice(bool(value))


def resolve_thinking(
    *,
    enable_thinking: bool | str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    reasoning_effort: str | None = None,
    default_template_kwargs: Mapping[str, Any] | None = None,
    can_think: bool = True,
) -> bool:
    """``resolve_thinking_choice(...).thinking``, for front ends without a rule set (``LLM.chat``,
    the CLI): the precedence table is that function's."""
    return resolve_thinking_choice(
        enable_thinking=enable_thinking, template_kwargs=template_kwargs, reasoning_effort=reasoning_effort,
        default_template_kwargs=default_template_kwargs, can_think=can_think,
    ).thinking


def resolve_thinking_budget(thinking_budget: int | None, reasoning_effort: str | None) -> int | None:
    """The reasoning-token budget of a request: an explicit ``thinking_budget`` (or vLLM's
    ``thinking_token_budget``) wins; else ``reasoning_effort``'s default
    (``REASONING_EFFORT_BUDGETS``: low 256, medium 1024, high no limit); else no limit. The budget
    counts only while thinking is on, whichever row of ``resolve_thinking`` turned it on."""
    if thinking_budget is not None:
        return thinking_budget
    return REASONING_EFFORT_BUDGETS.get(reasoning_effort) if reasoning_effort is not None else None
