"""Every error the server can answer: status code and OpenAI envelope; nothing breaks after."""

from __future__ import annotations

import asyncio
import json
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


def test_client_disconnect_mid_stream_frees_blocks(start_server, tiny_long_dir) -> None:
    # 60000 tokens on the 64k-context model: the request cannot end before the client goes
    srv = start_server(tiny_long_dir, max_num_seqs=1, max_model_len=65536)
    # the bias makes every token the word "Hello", so each step streams text
    body = {"messages": msg(), "stream": True, "max_tokens": 60000, "ignore_eos": True, "logit_bias": {"9707": 100}}
    with httpx.stream("POST", srv.v1 + "/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200, r.read()
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


def test_overload_gives_429_with_retry_after(start_server, tiny_long_dir) -> None:
    """One running slot and one queue place: A holds the slot, B takes the place, C is refused
    with 429; once A goes, B runs to the end."""
    srv = start_server(tiny_long_dir, max_num_seqs=1, max_queued_requests=1, max_model_len=65536)
    url = srv.v1 + "/chat/completions"
    # A: every token the word "Hello", streamed as content from the first (no reasoning section),
    # and far more tokens than the test takes to send B and C
    long = {"messages": msg(), "stream": True, "max_tokens": 60000, "ignore_eos": True, "logit_bias": {"9707": 100},
            "enable_thinking": False}
    short = {"messages": msg(), "max_tokens": 5, "ignore_eos": True, "temperature": 0}

    async def wait_until(condition, what: str) -> None:
        deadline = time.monotonic() + 20
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting until {what}"
            await asyncio.sleep(0.005)

    async def main() -> tuple[int, int, httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            async with client.stream("POST", url, json=long) as a:
                # a streamed token (not the opening chunk, whose content is "") means A was admitted:
                # it holds the only running slot. The line iterator stays referenced: one dropped
                # after the break is finalized, and closing it closes A's connection (A is aborted)
                streamed = 0
                lines = a.aiter_lines()
                async for line in lines:
                    if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                        streamed += 1
                        break
                assert srv.engine.num_queued() == 0
                b_task = asyncio.create_task(client.post(url, json=short))
                await wait_until(lambda: srv.engine.num_queued() == 1, "B waits in the queue")
                c = await client.post(url, json=short)
                assert srv.engine.num_queued() == 1, "A ended before C was sent"
                a_status = a.status_code
            # leaving the block closes A's connection: the server aborts A and admits B
            b = await b_task
        return a_status, streamed, b, c

    a_status, streamed, b, c = asyncio.run(main())
    assert a_status == 200 and streamed == 1
    assert_error(c, 429)
    assert int(c.headers["Retry-After"]) >= 1
    assert b.status_code == 200, b.text
    assert b.json()["usage"]["completion_tokens"] == 5
    srv.assert_no_leaks()
    assert srv.engine.engine.stats().num_aborted == 1  # A, and nothing else


def test_queue_wait_timeout_is_503(start_server, tiny_long_dir) -> None:
    """One running slot: A holds it, B waits longer than max_queue_wait and is refused with 503;
    once A goes, the next request runs to the end."""
    srv = start_server(tiny_long_dir, max_num_seqs=1, max_queue_wait=0.05, max_model_len=65536)
    url = srv.v1 + "/chat/completions"
    # A: far more tokens than the test takes (as in test_overload_gives_429_with_retry_after)
    long = {"messages": msg(), "stream": True, "max_tokens": 60000, "ignore_eos": True, "logit_bias": {"9707": 100},
            "enable_thinking": False}
    short = {"messages": msg(), "max_tokens": 5, "ignore_eos": True, "temperature": 0}

    async def main() -> tuple[int, httpx.Response, int, httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            async with client.stream("POST", url, json=long) as a:
                # a streamed token means A was admitted: it holds the only running slot (the line
                # iterator stays referenced: a dropped one is finalized, which closes A's connection)
                lines = a.aiter_lines()
                async for line in lines:
                    if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                        break
                b = await client.post(url, json=short)
                unfinished = await srv.engine.run_in_engine(lambda e: e.scheduler.num_unfinished)
                a_status = a.status_code
            # leaving the block closes A's connection: the server aborts A, the slot is free again
            c = await client.post(url, json=short)
        return a_status, b, unfinished, c

    a_status, b, unfinished, c = asyncio.run(main())
    assert a_status == 200
    assert unfinished == 1, "A ended before B was answered"
    error = assert_error(b, 503)
    assert "waited too long in the queue" in error["message"], error
    assert c.status_code == 200, c.text
    assert c.json()["usage"]["completion_tokens"] == 5
    srv.assert_no_leaks()
