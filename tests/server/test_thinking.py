"""Thinking on/off x stream on/off x return_reasoning on/off: reasoning never leaks into content."""

from __future__ import annotations

import itertools

import httpx
import pytest

from tests.server.conftest import ANSWER, REASONING


@pytest.fixture(scope="module")
def server(start_server, scripted_model_dir):
    return start_server(scripted_model_dir)


def chat(server, stream: bool, **fields) -> tuple[str | None, str | None, dict]:
    body = {"model": server.model, "messages": [{"role": "user", "content": "你是谁？"}], "temperature": 0,
            "stream": stream, **fields}
    if not stream:
        r = httpx.post(server.v1 + "/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        data = r.json()
        message = data["choices"][0]["message"]
        return message.get("reasoning_content"), message["content"], data["usage"]
    body["stream_options"] = {"include_usage": True}
    reasoning, content, usage = [], [], None
    with httpx.stream("POST", server.v1 + "/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            import json

            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk["choices"]:
                reasoning.append(choice["delta"].get("reasoning_content") or "")
                content.append(choice["delta"].get("content") or "")
    return ("".join(reasoning) or None), "".join(content), usage


@pytest.mark.parametrize(
    "thinking,stream,return_reasoning", list(itertools.product([True, False], repeat=3))
)
def test_reasoning_matrix(server, thinking: bool, stream: bool, return_reasoning: bool) -> None:
    reasoning, content, usage = chat(
        server, stream, chat_template_kwargs={"enable_thinking": thinking}, return_reasoning=return_reasoning
    )
    assert content == ANSWER
    assert "<think>" not in content and "</think>" not in content and REASONING not in content
    if thinking and return_reasoning:
        assert reasoning == REASONING
    else:
        assert reasoning is None
    # <think> Hmm , okay </think> are the reasoning tokens; \n\n Hello there ! <|im_end|> the answer
    assert usage["completion_tokens_details"]["reasoning_tokens"] == (5 if thinking else 0)
    assert usage["completion_tokens"] == (10 if thinking else 4)


def test_top_level_enable_thinking_overrides_template_kwargs(server) -> None:
    reasoning, content, _ = chat(server, False, enable_thinking=False, chat_template_kwargs={"enable_thinking": True})
    assert reasoning is None and content == ANSWER


def test_server_default_template_kwargs(start_server, scripted_model_dir) -> None:
    from swiftlm.config import ServerConfig

    srv = start_server(scripted_model_dir, ServerConfig(default_chat_template_kwargs={"enable_thinking": False}))
    reasoning, content, usage = chat(srv, False)
    assert reasoning is None and content == ANSWER and usage["completion_tokens"] == 4
    reasoning, content, _ = chat(srv, False, enable_thinking=True)
    assert reasoning == REASONING


def test_thinking_budget_forces_the_end_of_thinking(server) -> None:
    # budget 2: <think> Hmm, then </think> and "\n\n" are forced; the chain continues to the answer
    reasoning, content, usage = chat(server, False, thinking_budget=2, chat_template_kwargs={"enable_thinking": True})
    assert reasoning == "Hmm"
    assert content == ANSWER
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 3


def test_think_switches_pass_through(server) -> None:
    r = httpx.post(server.base_url + "/tokenize", json={"messages": [{"role": "user", "content": "hi /no_think"}]})
    assert r.status_code == 200
    text = httpx.post(server.base_url + "/detokenize", json={"tokens": r.json()["tokens"]}).json()["prompt"]
    assert "hi /no_think" in text
    server.assert_no_leaks()
