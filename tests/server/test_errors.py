"""Every error the server can answer: status code and OpenAI envelope; nothing breaks after."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from swiftlm.config import ServerConfig
from tests.server.conftest import ANSWER


@pytest.fixture(scope="module")
def server(start_server, tiny_tied_dir):
    return start_server(tiny_tied_dir, max_model_len=256)


def assert_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def post(server, path: str, **kwargs) -> httpx.Response:
    return httpx.post(server.base_url + path, timeout=30, **kwargs)


def msg(text: str = "hi") -> list[dict]:
    return [{"role": "user", "content": text}]


BAD_CHAT_BODIES = [
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, None),
    ({"messages": msg(), "temperature": "hot"}, "temperature"),
    ({"messages": msg(), "temperature": 3.0}, "temperature"),
    ({"messages": msg(), "max_tokens": "12"}, "max_tokens"),
    ({"messages": msg(), "max_tokens": 0}, "max_tokens"),
    ({"messages": msg(), "top_p": 0}, "top_p"),
    ({"messages": msg(), "stream": "yes"}, "stream"),
    ({"messages": msg(), "n": 100}, "n"),
    ({"messages": msg(), "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"messages": msg(), "logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"messages": msg(), "top_logprobs": 3}, "top_logprobs"),
    ({"messages": msg(), "max_tokens": 5000}, "max_tokens"),
    ({"messages": msg("word " * 400)}, "messages"),
    ({"messages": msg(), "presence_penalty": 5}, "presence_penalty"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, None),
]


@pytest.mark.parametrize("body,param", BAD_CHAT_BODIES)
def test_bad_chat_requests_are_400(server, body: dict, param: str | None) -> None:
    error = assert_error(post(server, "/v1/chat/completions", json=body), 400)
    if param is not None:
        assert error["param"] is not None and error["param"].startswith(param)


def test_malformed_json_is_400(server) -> None:
    r = post(server, "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert_error(r, 400)


def test_unknown_fields_are_ignored(server) -> None:
    r = post(server, "/v1/chat/completions", json={"messages": msg(), "max_tokens": 2, "frobnicate": 1})
    assert r.status_code == 200


def test_unknown_model_and_route_are_404(server) -> None:
    assert_error(post(server, "/v1/chat/completions", json={"model": "gpt-9", "messages": msg()}), 404, "model")
    assert_error(httpx.get(server.base_url + "/v1/nothing-here"), 404)
    r = httpx.delete(server.base_url + "/v1/sessions/never-opened")
    assert_error(r, 404)


def test_completions_errors(server) -> None:
    assert_error(post(server, "/v1/completions", json={"prompt": ""}), 400, "prompt")
    assert_error(post(server, "/v1/completions", json={"prompt": [1, 2, 99999999]}), 400, "prompt")
    assert_error(post(server, "/v1/completions", json={"prompt": "x", "suffix": "y"}), 400)


def test_client_disconnect_mid_stream_frees_blocks(start_server, tiny_tied_dir) -> None:
    srv = start_server(tiny_tied_dir, max_model_len=4096)
    # the bias makes every token the word "Hello", so each step streams text
    body = {"messages": msg(), "stream": True, "max_tokens": 4000, "ignore_eos": True, "logit_bias": {"9707": 100}}
    with httpx.stream("POST", srv.v1 + "/chat/completions", json=body, timeout=30) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 3:
                break  # close the connection mid-stream
    srv.assert_no_leaks()
    assert srv.engine.engine.stats().num_aborted == 1


def test_after_all_errors_the_server_still_answers(server) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="EMPTY")
    resp = client.chat.completions.create(model=server.model, messages=msg(), max_tokens=4, temperature=0)
    assert resp.choices[0].finish_reason in ("stop", "length")
    server.assert_no_leaks()


def test_api_key(start_server, scripted_model_dir) -> None:
    srv = start_server(scripted_model_dir, ServerConfig(api_key="sk-secret"))
    body = {"messages": msg(), "enable_thinking": False}
    assert_error(post(srv, "/v1/chat/completions", json=body), 401)
    assert_error(post(srv, "/v1/chat/completions", json=body, headers={"Authorization": "Bearer nope"}), 401)
    ok = post(srv, "/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-secret"})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == ANSWER
    assert httpx.get(srv.base_url + "/health").status_code == 200  # probes need no key
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=srv.v1, api_key="EMPTY").models.list()


def test_overload_gives_429_with_retry_after(start_server, tiny_tied_dir) -> None:
    srv = start_server(tiny_tied_dir, max_num_seqs=2, max_queued_requests=4)
    body = {"messages": msg(), "max_tokens": 40, "ignore_eos": True, "temperature": 0}

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(srv.v1 + "/chat/completions", json=body) for _ in range(20)))

    start = time.monotonic()
    responses = asyncio.run(main())
    elapsed = time.monotonic() - start
    codes = [r.status_code for r in responses]
    print(f"20 requests: {codes.count(200)} ok, {codes.count(429)} refused with 429 in {elapsed:.2f}s")
    assert set(codes) == {200, 429}
    for r in responses:
        if r.status_code == 429:
            assert_error(r, 429)
            assert int(r.headers["Retry-After"]) >= 1
        else:
            assert r.json()["usage"]["completion_tokens"] == 40
    srv.assert_no_leaks()


def test_queue_wait_timeout_is_503(start_server, tiny_tied_dir) -> None:
    srv = start_server(tiny_tied_dir, max_num_seqs=1, max_queue_wait=0.05)
    long = {"messages": msg(), "max_tokens": 150, "ignore_eos": True, "temperature": 0}

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(srv.v1 + "/chat/completions", json=long) for _ in range(3)))

    codes = sorted(r.status_code for r in asyncio.run(main()))
    assert codes[0] == 200 and 503 in codes
    srv.assert_no_leaks()
