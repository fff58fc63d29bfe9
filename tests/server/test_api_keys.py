"""Keys from a file, each with its own limits: one key over its limit gets a 429 with Retry-After
while another key's requests succeed; sessions and batch jobs stay with the key that made them;
keys never reach the logs."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from swiftlm.config import ApiKeySpec, EngineConfig, ServerConfig
from swiftlm.server.launch import _effective_config
from tests.server.test_batch_api import chat_body, jsonl, wait_done

KEYS = (
    ApiKeySpec("sk-alice-secret", name="alice", rpm=3),
    ApiKeySpec("sk-bob-secret", name="bob"),
    ApiKeySpec("sk-carol-secret", name="carol", tpm=60),
)


@pytest.fixture(scope="module")
def server(start_server, tiny_tied_dir):
    return start_server(tiny_tied_dir, ServerConfig(api_key="sk-admin", api_keys=KEYS, default_rpm=1000))


def _client(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key=key, max_retries=0)


def _ask(client: openai.OpenAI, server, max_tokens: int = 4, **extra):
    return client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens,
        temperature=0, extra_body={"enable_thinking": False, **extra})


def test_one_key_over_its_rpm_gets_429_while_others_succeed(server) -> None:
    alice, bob = _client(server, "sk-alice-secret"), _client(server, "sk-bob-secret")
    for _ in range(3):
        _ask(alice, server)
    with pytest.raises(openai.RateLimitError) as info:
        _ask(alice, server)
    response = info.value.response
    assert 1 <= int(response.headers["retry-after"]) <= 60
    error = response.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and "'alice'" in error["message"] and "RPM" in error["message"]
    assert "sk-alice" not in response.text
    for _ in range(5):  # bob's key is limited on its own (default_rpm 1000), not by alice's use
        assert _ask(bob, server).choices[0].finish_reason in ("stop", "length")
    streamed = httpx.post(server.v1 + "/completions", headers={"Authorization": "Bearer sk-alice-secret"},
                          json={"model": server.model, "prompt": "x", "max_tokens": 2, "stream": True}, timeout=30)
    assert streamed.status_code == 429  # refused before the stream starts
    metrics = httpx.get(server.base_url + "/metrics", timeout=10).text
    line = next(x for x in metrics.splitlines() if 'reason="rate_limit"' in x and not x.startswith("#"))
    assert float(line.rsplit(" ", 1)[1]) >= 2


def test_tokens_per_minute_count_generated_tokens(server) -> None:
    carol = _client(server, "sk-carol-secret")
    first = _ask(carol, server, max_tokens=40, ignore_eos=True)
    assert first.usage.prompt_tokens + first.usage.completion_tokens >= 40
    with pytest.raises(openai.RateLimitError) as info:  # what it generated counts against its TPM
        _ask(carol, server, max_tokens=40, ignore_eos=True)
    assert "TPM" in info.value.response.json()["error"]["message"]
    _ask(_client(server, "sk-bob-secret"), server)


def test_wrong_or_missing_keys_are_401_and_every_listed_key_is_accepted(server) -> None:
    for key in ("sk-wrong", "sk-alice"):
        with pytest.raises(openai.AuthenticationError):
            _ask(_client(server, key), server)
    assert httpx.get(server.v1 + "/models", timeout=10).status_code == 401
    assert _client(server, "sk-admin").models.list().data  # --api-key joins the file's keys


def test_sessions_and_batch_jobs_belong_to_their_key(server) -> None:
    bob, admin = _client(server, "sk-bob-secret"), _client(server, "sk-admin")
    _ask(bob, server, session_id="shared-name")
    other = httpx.delete(server.v1 + "/sessions/shared-name", headers={"Authorization": "Bearer sk-admin"}, timeout=10)
    assert other.status_code == 404  # the same session id under another key is another session
    mine = httpx.delete(server.v1 + "/sessions/shared-name", headers={"Authorization": "Bearer sk-bob-secret"},
                        timeout=10)
    assert mine.status_code == 200
    lines = [{"custom_id": f"l{i}", "url": "/v1/chat/completions", "method": "POST", "body": chat_body(server, i, 2)}
             for i in range(6)]
    upload = bob.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = bob.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        admin.batches.retrieve(batch.id)
    done = wait_done(bob, batch.id)  # its lines run as bob, through authentication, at background priority
    assert done.status == "completed" and done.request_counts.completed == 6
    results = [json.loads(x) for x in bob.files.content(done.output_file_id).text.splitlines()]
    assert all(r["response"]["status_code"] == 200 for r in results)


def test_batch_lines_do_not_spend_the_interactive_rate(start_server, tiny_tied_dir) -> None:
    tight = start_server(tiny_tied_dir, ServerConfig(api_keys=(ApiKeySpec("sk-d", rpm=2),)))
    client = _client(tight, "sk-d")
    lines = [{"custom_id": f"l{i}", "url": "/v1/chat/completions", "method": "POST", "body": chat_body(tight, i, 2)}
             for i in range(5)]
    batch = client.batches.create(input_file_id=client.files.create(file=("in.jsonl", jsonl(lines)),
                                  purpose="batch").id, endpoint="/v1/chat/completions", completion_window="24h")
    assert wait_done(client, batch.id).request_counts.completed == 5
    _ask(client, tight)  # 5 lines ran, yet the key still has its 2 requests this minute
    _ask(client, tight)


def test_keys_never_reach_the_effective_configuration_log() -> None:
    logged = _effective_config(EngineConfig(model="m"), ServerConfig(api_key="sk-admin", api_keys=KEYS), None)
    for spec in KEYS:
        assert spec.key not in logged
    assert "sk-admin" not in logged and "alice" in logged


def test_serve_flags_read_the_key_file_and_connection_limits(tmp_path) -> None:
    from swiftlm.cli import build_configs, build_parser

    keys = tmp_path / "keys"
    keys.write_text("sk-1 name=one rpm=5\nsk-2 tpm=900\n")
    args = ["serve", "m", "--api-key-file", str(keys), "--default-rpm", "60", "--default-tpm", "1000",
            "--request-receive-timeout", "10", "--timeout-keep-alive", "2", "--max-concurrent-connections", "50"]
    server = build_configs(build_parser().parse_args(args))[1]
    assert [(s.name, s.rpm, s.tpm) for s in server.api_keys] == [("one", 5, None), (None, None, 900)]
    assert (server.default_rpm, server.default_tpm) == (60, 1000)
    assert (server.request_receive_timeout_s, server.timeout_keep_alive_s, server.max_concurrent_connections) == (
        10.0, 2.0, 50)
