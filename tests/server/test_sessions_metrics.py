"""Sessions over HTTP (scoped to the API key), metrics, and the served process itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

from tests.server.conftest import ANSWER, free_port


@pytest.fixture(scope="module")
def server(start_server, tiny_tied_dir):
    return start_server(tiny_tied_dir)


def test_session_turn_two_reuses_turn_one(server) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="EMPTY")
    messages = [{"role": "system", "content": "You answer briefly. " * 20}, {"role": "user", "content": "你好"}]
    extra = {"session_id": "conv-1", "enable_thinking": False, "ignore_eos": True}
    first = client.chat.completions.create(model=server.model, messages=messages, max_tokens=8, temperature=0, extra_body=extra)
    turn1_tokens = first.usage.prompt_tokens + first.usage.completion_tokens
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "再见"}]
    second = client.chat.completions.create(model=server.model, messages=messages, max_tokens=8, temperature=0, extra_body=extra)
    cached = second.usage.prompt_tokens_details.cached_tokens
    print(f"turn 1: {turn1_tokens} tokens; turn 2: prompt {second.usage.prompt_tokens}, cached {cached}")
    assert cached == turn1_tokens - 1  # all of turn 1 except its last sampled token, never run
    # another API key does not see this session
    other = openai.OpenAI(base_url=server.v1, api_key="another-key")
    third = other.chat.completions.create(model=server.model, messages=messages, max_tokens=8, temperature=0, extra_body=extra)
    assert third.usage.prompt_tokens_details.cached_tokens < cached
    r = httpx.delete(server.v1 + "/sessions/conv-1", headers={"Authorization": "Bearer EMPTY"})
    assert r.status_code == 200 and r.json()["deleted"] is True
    assert httpx.delete(server.v1 + "/sessions/conv-1", headers={"Authorization": "Bearer EMPTY"}).status_code == 404
    httpx.delete(server.v1 + "/sessions/conv-1", headers={"Authorization": "Bearer another-key"})
    server.assert_no_leaks()


def test_metrics_exposed(server) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="EMPTY")
    client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "x"}], max_tokens=3)
    text = httpx.get(server.base_url + "/metrics").text
    for name in (
        "swiftlm:time_to_first_token_seconds_bucket",
        "swiftlm:inter_token_latency_seconds",
        "swiftlm:e2e_request_latency_seconds_count",
        "swiftlm:request_queue_time_seconds_count",
        "swiftlm:num_requests_running",
        "swiftlm:num_requests_waiting",
        "swiftlm:kv_cache_usage_perc",
        "swiftlm:prefix_cache_queries_total",
        "swiftlm:prefix_cache_hits_total",
        "swiftlm:num_sessions",
        "swiftlm:prompt_tokens_total",
        "swiftlm:generation_tokens_total",
        "swiftlm:request_rejected",
    ):
        assert name in text, name
    count = [ln for ln in text.splitlines() if ln.startswith("swiftlm:e2e_request_latency_seconds_count")]
    assert float(count[0].split()[-1]) >= 1


def _counter(server, name: str) -> float:
    lines = httpx.get(server.base_url + "/metrics").text.splitlines()
    return sum(float(ln.split()[-1]) for ln in lines if ln.startswith(name + "{"))


@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
@pytest.mark.parametrize("stream", [False, True])
def test_every_answer_is_counted_streamed_or_whole(server, path: str, stream: bool) -> None:
    before = [_counter(server, n) for n in ("swiftlm:request_success_total", "swiftlm:generation_tokens_total",
                                            "swiftlm:prompt_tokens_total")]
    body = {"model": server.model, "max_tokens": 5, "ignore_eos": True, "stream": stream, "n": 2,
            **({"prompt": ["river stone", "sky"]} if path == "/completions" else
               {"messages": [{"role": "user", "content": "river stone"}]})}
    r = httpx.post(server.v1 + path, json=body, timeout=30)
    assert r.status_code == 200 and (not stream or r.text.rstrip().endswith("data: [DONE]"))
    after = [_counter(server, n) for n in ("swiftlm:request_success_total", "swiftlm:generation_tokens_total",
                                           "swiftlm:prompt_tokens_total")]
    prompts = 2 if path == "/completions" else 1
    assert after[0] - before[0] == prompts  # one per prompt, its n sequences together
    assert after[1] - before[1] == prompts * 2 * 5
    assert after[2] > before[2]


def test_tokenize_roundtrip(server) -> None:
    r = httpx.post(server.base_url + "/tokenize", json={"prompt": "你好 👋 world"})
    assert r.status_code == 200 and r.json()["count"] == len(r.json()["tokens"])
    back = httpx.post(server.base_url + "/detokenize", json={"tokens": r.json()["tokens"]})
    assert back.json()["prompt"] == "你好 👋 world"


def test_serve_command_health_and_graceful_shutdown(scripted_model_dir) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "swiftlm", "serve", str(scripted_model_dir), "--port", str(port), "--dtype", "float32",
         "--served-model-name", "scripted"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        seen_loading = False
        while time.monotonic() < deadline:
            try:
                code = httpx.get(base + "/health", timeout=10).status_code  # a loaded machine answers late
            except httpx.HTTPError:
                time.sleep(0.05)
                continue
            seen_loading |= code == 503
            if code == 200:
                break
            time.sleep(0.02)
        assert code == 200
        client = openai.OpenAI(base_url=base + "/v1", api_key="EMPTY")
        reply = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}],
                                               temperature=0, extra_body={"enable_thinking": False})
        assert reply.choices[0].message.content == ANSWER
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert "effective configuration" in out
    finally:
        if proc.poll() is None:
            proc.kill()


def test_completions_sessions_are_scoped_to_the_api_key(server) -> None:
    """A session_id on /v1/completions names the caller's own session: another key with the same id
    neither reuses nor replaces it, and only the owner can delete it."""
    prompt = "Once upon a time " * 12

    def complete(key: str) -> dict:
        r = httpx.post(server.v1 + "/completions", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                       json={"model": server.model, "prompt": prompt, "max_tokens": 4, "temperature": 0,
                             "ignore_eos": True, "session_id": "c-1"})
        assert r.status_code == 200, r.text
        return r.json()

    def sessions() -> dict[str, list[int]]:
        return server.run_in_engine(lambda e: {s.session_id: list(s.token_ids) for s in e.kv.sessions.all()})

    complete("key-a")
    owned = {sid: t for sid, t in sessions().items() if sid.endswith("/c-1")}
    assert len(owned) == 1 and "c-1" not in sessions()  # stored under the key's scope, not the bare id
    (key_a_session, tokens), = owned.items()
    complete("key-b")
    after = sessions()
    assert after[key_a_session] == tokens  # key B did not take over or replace key A's session
    assert len([sid for sid in after if sid.endswith("/c-1")]) == 2
    assert httpx.delete(server.v1 + "/sessions/c-1", headers={"Authorization": "Bearer key-b"}).status_code == 200
    assert key_a_session in sessions()  # B deleted only its own
    assert httpx.delete(server.v1 + "/sessions/c-1", headers={"Authorization": "Bearer key-a"}).status_code == 200
    assert not [sid for sid in sessions() if sid.endswith("/c-1")]
    server.assert_no_leaks()
