"""Forgiving request bodies: a nested ``extra_body``, ``reasoning_effort``, vLLM's field names,
``best_of``, and the fields accepted for the articles' clients (no model)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from swiftlm.core.generation import REASONING_EFFORT_BUDGETS
from swiftlm.server.completions.chat_protocol import ChatCompletionRequest
from swiftlm.server.completions.completion_protocol import CompletionRequest
from swiftlm.server.completions.request_mapping import (
    chat_messages,
    sampling_params_from_chat,
    thinking_enabled,
)
from swiftlm.server.completions.tokenizer_protocol import TokenizeRequest

USER = [{"role": "user", "content": "hi"}]
EFFORTS = ["none", "minimal", "low", "medium", "high"]


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": USER, **fields})


def params(req: ChatCompletionRequest) -> Any:
    return sampling_params_from_chat(req, 100, None)


# ---------------------------------------------------------------- a nested extra_body


def test_nested_extra_body_is_read_as_top_level() -> None:
    """The raw-HTTP client of article 000 nests its extensions in the JSON body."""
    nested = {"enable_thinking": False, "return_reasoning": False, "session_id": "user_12345", "top_k": 5,
              "max_new_tokens": 64, "past_key_values": None}
    req = chat(extra_body=nested, temperature=0.5)
    assert req.enable_thinking is False and req.return_reasoning is False
    assert (req.session_id, req.top_k, req.max_new_tokens, req.temperature) == ("user_12345", 5, 64, 0.5)
    assert thinking_enabled(req, None) is False
    assert "extra_body" not in req.model_dump()
    assert chat(extra_body={}).enable_thinking is None and chat(extra_body=None).enable_thinking is None


def test_top_level_wins_over_extra_body() -> None:
    req = chat(top_k=3, enable_thinking=True, extra_body={"top_k": 5, "enable_thinking": False, "min_p": 0.1})
    assert (req.top_k, req.enable_thinking, req.min_p) == (3, True, 0.1)
    # a top-level null is "not given": the nested value stands
    assert chat(top_k=None, extra_body={"top_k": 5}).top_k == 5


def test_nested_fields_are_validated_as_strictly_as_top_level_ones() -> None:
    with pytest.raises(ValidationError) as info:
        chat(extra_body={"max_tokens": "12"})
    assert [e["loc"] for e in info.value.errors()] == [("max_tokens",)]
    with pytest.raises(ValidationError, match="extra_body must be a JSON object"):
        chat(extra_body=["enable_thinking"])


def test_extra_body_on_completions_and_tokenize() -> None:
    completion = CompletionRequest.model_validate({"prompt": "x", "extra_body": {"top_k": 4, "session_id": "s"}})
    assert (completion.top_k, completion.session_id) == (4, "s")
    tokenize = TokenizeRequest.model_validate({"messages": USER, "extra_body": {"enable_thinking": False}})
    assert tokenize.enable_thinking is False and thinking_enabled(tokenize, None) is False


def test_extra_body_inside_a_message_is_not_merged() -> None:
    """Only request bodies read extra_body; a message's unknown keys stay ignored."""
    req = chat(messages=[{"role": "user", "content": "hi", "extra_body": {"role": "system"}}])
    assert req.messages[0].role == "user"


# ---------------------------------------------------------------- reasoning_effort and budgets


@pytest.mark.parametrize("effort", EFFORTS)
def test_reasoning_effort_maps_onto_thinking(effort: str) -> None:
    on = effort not in ("none", "minimal")
    req = chat(reasoning_effort=effort)
    assert thinking_enabled(req, None) is on
    assert thinking_enabled(req, {"enable_thinking": not on}) is on  # beats the server's default
    assert params(req).thinking_budget == (REASONING_EFFORT_BUDGETS[effort] if on else None)
    nested = chat(extra_body={"reasoning_effort": effort})
    assert thinking_enabled(nested, None) is on


def test_explicit_switches_and_budgets_beat_reasoning_effort() -> None:
    assert thinking_enabled(chat(reasoning_effort="high", enable_thinking=False), None) is False
    assert thinking_enabled(chat(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True}), None)
    assert params(chat(reasoning_effort="low", thinking_budget=9)).thinking_budget == 9
    assert params(chat(reasoning_effort="low", thinking_token_budget=0)).thinking_budget == 0


def test_an_unknown_reasoning_effort_is_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        chat(reasoning_effort="extreme")
    assert [e["loc"] for e in info.value.errors()] == [("reasoning_effort",)]


def test_thinking_token_budget_is_an_alias_of_thinking_budget() -> None:
    assert chat(thinking_token_budget=12).thinking_budget == 12
    assert params(chat(thinking_token_budget=12)).thinking_budget == 12
    assert params(chat(extra_body={"thinking_token_budget": 3})).thinking_budget == 3
    assert chat(thinking_budget=5, thinking_token_budget=5).thinking_budget == 5
    with pytest.raises(ValidationError, match="two names of one field"):
        chat(thinking_budget=5, thinking_token_budget=6)
    with pytest.raises(ValidationError):
        chat(thinking_token_budget=-1)


# ---------------------------------------------------------------- best_of and accepted fields


@pytest.mark.parametrize("make", [chat, lambda **f: CompletionRequest.model_validate({"prompt": "x", **f})])
def test_best_of_other_than_1_or_n_is_an_error(make: Any) -> None:
    assert make(best_of=None).best_of is None
    assert make(best_of=1).best_of == 1
    assert make(n=3, best_of=3).n == 3
    for fields in ({"best_of": 2}, {"n": 2, "best_of": 4}, {"extra_body": {"best_of": 5}}):
        with pytest.raises(ValidationError, match="best_of .* is not supported .*V1 engine"):
            make(**fields)
    with pytest.raises(ValidationError):
        make(best_of=0)


def test_parallel_tool_calls_and_session_reset_are_typed_fields() -> None:
    assert chat(parallel_tool_calls=False).parallel_tool_calls is False
    assert chat(session_reset=True).session_reset is True and chat().session_reset is False
    for fields in ({"parallel_tool_calls": "yes"}, {"session_reset": 1}):
        with pytest.raises(ValidationError):
            chat(**fields)


# ---------------------------------------------------------------- reasoning field names


def test_both_reasoning_names_are_accepted_in_input() -> None:
    history = [*USER, {"role": "assistant", "content": "a", "reasoning": "r1"},
               {"role": "user", "content": "b"}, {"role": "assistant", "content": "c", "reasoning_content": "r2"},
               {"role": "user", "content": "d"}]
    plain = chat_messages(chat(messages=history).messages)
    assert [m.get("reasoning_content") for m in plain] == [None, "r1", None, "r2", None]

