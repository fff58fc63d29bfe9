"""Several served model names (``--served-model-name A B``): all listed, any accepted, each echoed."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from swiftlm.config import ServerConfig

NAMES = ("Qwen/Qwen3-0.6B", "Qwen-0.6B")  # the two names the articles use


@pytest.fixture(scope="module")
def server(start_server, tiny_tied_dir):
    return start_server(tiny_tied_dir, ServerConfig(served_model_names=NAMES), max_model_len=256)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=30)


def chat_body(model: str | None, **extra) -> dict:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0, **extra}
    return body if model is None else {"model": model, **body}


def test_models_lists_every_name(server) -> None:
    cards = httpx.get(server.v1 + "/models").json()["data"]
    assert [c["id"] for c in cards] == list(NAMES)
    assert all(c["object"] == "model" and c["root"] == NAMES[0] for c in cards)
    listed = openai.OpenAI(base_url=server.v1, api_key="EMPTY").models.list()
    assert [m.id for m in listed.data] == list(NAMES)
    for name in NAMES:
        r = httpx.get(f"{server.v1}/models/{name}")
        assert r.status_code == 200 and r.json()["id"] == name


@pytest.mark.parametrize("name", NAMES)
def test_each_name_is_served_and_echoed(server, name: str) -> None:
    chat = post(server, "/v1/chat/completions", chat_body(name))
    assert chat.status_code == 200, chat.text
    assert chat.json()["model"] == name
    completion = post(server, "/v1/completions", {"model": name, "prompt": "hi", "max_tokens": 3, "temperature": 0})
    assert completion.status_code == 200, completion.text
    assert completion.json()["model"] == name
    client = openai.OpenAI(base_url=server.v1, api_key="EMPTY")
    stream = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0, stream=True
    )
    assert {chunk.model for chunk in stream} == {name}


def test_both_names_answer_alike(server) -> None:
    answers = [post(server, "/v1/chat/completions", chat_body(n)).json()["choices"][0]["message"] for n in NAMES]
    assert answers[0] == answers[1]


def test_no_name_reports_the_first(server) -> None:
    r = post(server, "/v1/chat/completions", chat_body(None))
    assert r.status_code == 200 and r.json()["model"] == NAMES[0]
    lines = [line for line in post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": True})
             .text.splitlines() if line.startswith("data: {")]  # fmt: skip
    assert lines and {json.loads(line[6:])["model"] for line in lines} == {NAMES[0]}


def test_a_third_name_is_404(server) -> None:
    for r in (post(server, "/v1/chat/completions", chat_body("Qwen3-0.6B")),
              post(server, "/v1/completions", {"model": "qwen", "prompt": "hi"}),
              httpx.get(server.v1 + "/models/Qwen3-0.6B")):  # fmt: skip
        assert r.status_code == 404, r.text
        error = r.json()["error"]
        assert error["code"] == "model_not_found"
        assert all(f"'{name}'" in error["message"] for name in NAMES)
    server.assert_no_leaks()
