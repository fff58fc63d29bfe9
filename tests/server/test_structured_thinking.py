"""Structured output with thinking on, on the scripted checkpoint (it thinks "Hmm, okay", then
answers "Hello there!"): the reasoning is free, the grammar starts after ``</think>``, and the
thinking budget still holds."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest

from tests.server.conftest import REASONING

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["n"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}


@pytest.fixture(scope="module")
def server(start_server, scripted_model_dir):
    return start_server(scripted_model_dir)


def _body(server, **fields: Any) -> dict[str, Any]:
    return {
        "model": server.model,
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0,
        "max_tokens": 80,
        "response_format": FORMAT,
        **fields,
    }


def _whole(server, **fields: Any) -> dict[str, Any]:
    r = httpx.post(server.v1 + "/chat/completions", json=_body(server, **fields), timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _streamed(server, **fields: Any) -> tuple[str, str, str | None]:
    reasoning = content = ""
    finish = None
    with httpx.stream(
        "POST", server.v1 + "/chat/completions", json=_body(server, stream=True, **fields), timeout=60
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    reasoning += choice["delta"].get("reasoning_content") or ""
                    content += choice["delta"].get("content") or ""
                    finish = choice.get("finish_reason") or finish
    return reasoning, content, finish


def test_reasoning_is_free_and_the_answer_follows_the_schema(server) -> None:
    choice = _whole(server, enable_thinking=True)
    # A grammar from the first token would have made the reasoning JSON; it is the model's own.
    assert choice["message"]["reasoning_content"] == REASONING
    jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
    assert choice["finish_reason"] == "stop"
    reasoning, content, finish = _streamed(server, enable_thinking=True)
    assert reasoning == REASONING and content == choice["message"]["content"] and finish == "stop"


def test_the_thinking_budget_still_holds_under_a_grammar(server) -> None:
    choice = _whole(server, enable_thinking=True, thinking_token_budget=2)
    reasoning = choice["message"]["reasoning_content"]
    assert reasoning != REASONING and REASONING.startswith(reasoning)  # cut after two tokens
    jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
    streamed_reasoning, content, _ = _streamed(server, enable_thinking=True, thinking_token_budget=2)
    assert streamed_reasoning == reasoning and content == choice["message"]["content"]


def test_thinking_off_constrains_from_the_first_token(server) -> None:
    choice = _whole(server, enable_thinking=False)
    assert not choice["message"].get("reasoning_content")
    jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
    server.assert_no_leaks()
