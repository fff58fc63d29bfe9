"""Chat the way the articles' clients use it, over HTTP on the scripted checkpoint: sessions that
send only the new messages, both reasoning field names, ``--reasoning-parser none``, and forgiving
bodies (a nested ``extra_body``, ``reasoning_effort``, ``thinking_token_budget``, ``best_of``)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import httpx
import pytest

from swiftlm.config import ServerConfig
from tests.server.conftest import ANSWER, REASONING

KEY = "EMPTY"
HEADERS = {"Authorization": f"Bearer {KEY}"}
OFF = {"enable_thinking": False}


@pytest.fixture(scope="module")
def server(start_server, scripted_model_dir):
    return start_server(scripted_model_dir)


@pytest.fixture(scope="module")
def inline_server(start_server, scripted_model_dir):
    return start_server(scripted_model_dir, ServerConfig(reasoning_parser="none"))


def post(server, **body: Any) -> httpx.Response:
    body = {"model": server.model, "temperature": 0, **body}
    body.setdefault("messages", [{"role": "user", "content": "你是谁？"}])
    return httpx.post(server.v1 + "/chat/completions", json=body, headers=HEADERS, timeout=30)


def answer(server, **body: Any) -> dict[str, Any]:
    r = post(server, **body)
    assert r.status_code == 200, r.text
    return r.json()


def streamed(server, **body: Any) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The deltas of a streamed answer and its usage."""
    body = {"model": server.model, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "你是谁？"}], **body}
    deltas, usage = [], None
    with httpx.stream("POST", server.v1 + "/chat/completions", json=body, headers=HEADERS, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                deltas += [choice["delta"] for choice in chunk["choices"]]
    return deltas, usage


def joined(deltas: list[dict[str, Any]], field: str) -> str:
    return "".join(d.get(field) or "" for d in deltas)


# ---------------------------------------------------------------- reasoning field names and parsers


def test_reasoning_is_sent_under_both_names(server) -> None:
    message = answer(server)["choices"][0]["message"]
    assert message["reasoning"] == message["reasoning_content"] == REASONING
    assert message["content"] == ANSWER
    deltas, _ = streamed(server)
    assert joined(deltas, "reasoning") == joined(deltas, "reasoning_content") == REASONING
    assert all(d.get("reasoning") == d.get("reasoning_content") for d in deltas)
    assert joined(deltas, "content") == ANSWER


def test_reasoning_parser_none_leaves_the_think_block_inline(inline_server) -> None:
    data = answer(inline_server)
    message = data["choices"][0]["message"]
    assert "reasoning" not in message and "reasoning_content" not in message
    content = message["content"]
    start, end = content.index("<think>"), content.index("</think>")
    assert start < content.index(REASONING) < end and content.endswith(ANSWER)
    deltas, usage = streamed(inline_server)
    assert joined(deltas, "content") == content  # the same text, whole and streamed
    assert not any("reasoning" in d or "reasoning_content" in d for d in deltas)
    assert usage is not None and usage["completion_tokens"] == data["usage"]["completion_tokens"]
    # thinking off: there is no think block to leave inline
    assert answer(inline_server, chat_template_kwargs=OFF)["choices"][0]["message"]["content"] == ANSWER
    inline_server.assert_no_leaks()


# ---------------------------------------------------------------- forgiving bodies


def test_nested_extra_body_switches_thinking_off(server) -> None:
    """Article 000's raw-HTTP client nests its extensions; top-level wins on conflict."""
    message = answer(server, extra_body={"enable_thinking": False, "return_reasoning": False})["choices"][0]["message"]
    assert message["content"] == ANSWER and "reasoning_content" not in message
    message = answer(server, enable_thinking=True, extra_body=OFF)["choices"][0]["message"]
    assert message["reasoning_content"] == REASONING


@pytest.mark.parametrize("effort", ["none", "minimal", "low", "medium", "high"])
def test_reasoning_effort(server, effort: str) -> None:
    data = answer(server, reasoning_effort=effort)
    message = data["choices"][0]["message"]
    assert message["content"] == ANSWER
    if effort in ("none", "minimal"):
        assert "reasoning_content" not in message
        assert data["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    else:  # the scripted reasoning is shorter than every effort's budget
        assert message["reasoning_content"] == REASONING


def test_thinking_token_budget_forces_the_end_of_thinking(server) -> None:
    budget = answer(server, thinking_budget=2)["choices"][0]["message"]
    alias = answer(server, thinking_token_budget=2)["choices"][0]["message"]
    assert alias == budget and alias["reasoning_content"] != REASONING and REASONING.startswith(alias["reasoning_content"])
    assert alias["content"] == ANSWER
    nested = answer(server, reasoning_effort="low", extra_body={"thinking_token_budget": 2})["choices"][0]["message"]
    assert nested == budget  # an explicit budget beats reasoning_effort's


def test_best_of_is_a_400_that_says_so(server) -> None:
    r = post(server, best_of=2)
    assert r.status_code == 400
    assert "best_of" in r.json()["error"]["message"] and "V1" in r.json()["error"]["message"]
    assert post(server, n=2, best_of=2, max_tokens=3).status_code == 200
    r = httpx.post(server.v1 + "/completions", json={"model": server.model, "prompt": "x", "best_of": 3}, timeout=30)
    assert r.status_code == 400 and "best_of" in r.json()["error"]["message"]


# ---------------------------------------------------------------- sessions


def session_text(server, session_id: str) -> str:
    key = f"{hashlib.sha256(KEY.encode()).hexdigest()[:16]}/{session_id}"
    ids = server.engine.session_tokens(key)
    assert ids is not None
    return httpx.post(server.base_url + "/detokenize", json={"tokens": ids}).json()["prompt"]


def fresh_prompt_tokens(server, messages: list[dict[str, Any]]) -> int:
    body = {"messages": messages, "chat_template_kwargs": OFF}
    return httpx.post(server.base_url + "/tokenize", json=body).json()["count"]


def test_a_session_sending_only_the_new_question_keeps_the_conversation(server) -> None:
    extra = {"session_id": "only-new", "enable_thinking": False}
    q1, q2 = "你好", "刚才说了什么？"
    first = answer(server, messages=[{"role": "user", "content": q1}], extra_body=extra)
    a1 = first["choices"][0]["message"]["content"]
    second = answer(server, messages=[{"role": "user", "content": q2}], extra_body=extra)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert second["usage"]["prompt_tokens"] > fresh_prompt_tokens(server, [{"role": "user", "content": q2}])
    text = session_text(server, "only-new")  # turn 2's prompt and answer, as the cache holds them
    assert text.index(q1) < text.index(a1) < text.index(q2)
    # sending the whole conversation instead continues the same session: nothing is doubled
    history = [{"role": "user", "content": q1}, {"role": "assistant", "content": a1},
               {"role": "user", "content": q2}, {"role": "assistant", "content": second["choices"][0]["message"]["content"]},
               {"role": "user", "content": "再见"}]
    third = answer(server, messages=history, extra_body=extra)
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] >= second["usage"]["prompt_tokens"]
    assert session_text(server, "only-new").count(q1) == 1
    server.assert_no_leaks()


def test_an_edited_history_renders_fresh_and_session_reset_starts_over(server) -> None:
    extra = {"session_id": "edited", "enable_thinking": False}
    q1 = [{"role": "user", "content": "你好"}]
    a1 = answer(server, messages=q1, extra_body=extra)["choices"][0]["message"]["content"]
    edited = [*q1, {"role": "assistant", "content": a1 + " (edited)"}, {"role": "user", "content": "再见"}]
    assert answer(server, messages=edited, extra_body=extra)["usage"]["prompt_tokens"] == fresh_prompt_tokens(server, edited)
    assert session_text(server, "edited").count("你好") == 1
    new = [{"role": "user", "content": "从头开始"}]
    reset = answer(server, messages=new, extra_body={**extra, "session_reset": True})
    assert reset["usage"]["prompt_tokens"] == fresh_prompt_tokens(server, new)
    assert "你好" not in session_text(server, "edited")
    # and the next new-only turn appends to the conversation that started over
    answer(server, messages=[{"role": "user", "content": "然后呢"}], extra_body=extra)
    text = session_text(server, "edited")
    assert "你好" not in text and text.index("从头开始") < text.index("然后呢")
    httpx.delete(server.v1 + "/sessions/edited", headers=HEADERS)
    server.assert_no_leaks()
