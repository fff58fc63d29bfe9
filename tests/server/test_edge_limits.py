"""Hostile input at the edge: each a 4xx in OpenAI's envelope, quickly, and the server keeps
serving: an oversized body (declared or chunked), a prompt of 100,000 tokens and one of megabytes,
deep JSON, invalid UTF-8, a lone surrogate."""

from __future__ import annotations

import httpx
import pytest

from swiftlm.config import ServerConfig

LIMIT = 1_000_000


@pytest.fixture(scope="module")
def server(start_server, tiny_tied_dir):
    return start_server(tiny_tied_dir, ServerConfig(max_request_bytes=LIMIT), max_model_len=4096)


def _post(server, path: str = "/chat/completions", **kwargs) -> httpx.Response:
    kwargs.setdefault("headers", {"content-type": "application/json"})
    return httpx.post(server.v1 + path, timeout=60, **kwargs)


def _check(r: httpx.Response, status: int, words: str) -> None:
    assert r.status_code == status, r.text[:300]
    error = r.json()["error"]
    assert words in error["message"] and error["type"] == "invalid_request_error"


def _chat(server, content: str) -> dict:
    return {"model": server.model, "max_tokens": 2, "messages": [{"role": "user", "content": content}]}


def test_oversized_bodies_are_413(server) -> None:
    big = b'{"model": "x", "prompt": "' + b"a" * (LIMIT + 10) + b'"}'
    _check(_post(server, "/completions", content=big), 413, "--max-request-bytes")

    def chunked():
        for _ in range(LIMIT // 50_000 + 2):
            yield b" " * 50_000  # no Content-Length: the limit is counted as the body arrives

    _check(_post(server, "/completions", content=chunked()), 413, "--max-request-bytes")
    ok = _post(server, json={**_chat(server, "x" * (LIMIT // 2))})  # under the limit: judged on its merits
    assert ok.status_code == 400 and "characters" in ok.json()["error"]["message"]


def test_long_prompts_are_refused_before_tokenising(server, monkeypatch) -> None:
    # what the tokenizer is asked to encode (a wall-clock bound would not tell: tokenising these
    # prompts takes about a second, and a loaded machine's stalls take longer)
    tokenizer = server.engine.tokenizer
    encoded: list[int] = []

    def encode(text: str, *args, **kwargs) -> list[int]:
        encoded.append(len(text))
        return type(tokenizer).encode(tokenizer, text, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", encode)
    r = _post(server, json=_chat(server, "hello " * 100_000))  # ~100,000 tokens, 600 kB
    _check(r, 400, "context window")
    r = _post(server, "/completions", json={"model": server.model, "prompt": "z" * 900_000, "max_tokens": 1})
    _check(r, 400, "characters")
    assert not [n for n in encoded if n >= 100_000], f"a long prompt was tokenised: {encoded}"
    r = _post(server, "/completions", json={"model": server.model, "prompt": "z" * 1000, "max_tokens": 1})
    assert r.status_code == 200 and 1000 in encoded  # a prompt that fits is tokenised through the spy


def test_deep_json_invalid_utf8_and_lone_surrogates_are_400(server) -> None:
    _check(_post(server, content=b"[" * 100_000 + b"]" * 100_000), 400, "parsing the body")
    _check(_post(server, content=b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}'), 400,
           "parsing the body")
    r = _post(server, content=b'{"model": "swiftlm-test", "max_tokens": 2, "messages": [{"role": "user", '
                              b'"content": "a\\ud800b"}]}')
    _check(r, 400, "surrogate")
    assert "messages[0].content" in r.json()["error"]["message"]
    r = _post(server, "/completions", content=b'{"model": "swiftlm-test", "prompt": "\\udfff", "max_tokens": 1}')
    _check(r, 400, "surrogate")


def test_huge_n_logit_bias_maps_and_stop_lists_are_400(server) -> None:
    _check(_post(server, json={**_chat(server, "hi"), "n": 10_000}), 400, "n")
    bias = {str(i): 1.0 for i in range(5000)}
    _check(_post(server, json={**_chat(server, "hi"), "logit_bias": bias}), 400, "logit_bias")
    _check(_post(server, json={**_chat(server, "hi"), "stop": ["x"] * 100}), 400, "stop")
    _check(_post(server, json={**_chat(server, "hi"), "stop": ["y" * 100_000]}), 400, "stop")
    ok = _post(server, json={**_chat(server, "hi"), "logit_bias": {str(i): 1.0 for i in range(100)}, "stop": ["zz"]})
    assert ok.status_code == 200, ok.text


def test_still_serving(server) -> None:
    r = _post(server, json=_chat(server, "hi"))
    assert r.status_code == 200, r.text
    server.assert_no_leaks()
