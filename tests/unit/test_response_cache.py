"""The response cache without a server: keys, stores (LRU, TTL, bytes, a corrupt file), stored answers."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from swiftlm.sampling import SamplingParams
from swiftlm.server.answer_cache.answers import (
    chat_answer_from_chunks,
    chat_hit_events,
    completion_answer_from_chunks,
    completion_hit_events,
    parse_events,
)
from swiftlm.server.answer_cache.policy import ResponseCache, bypasses_cache, is_deterministic
from swiftlm.server.answer_cache.store import MemoryStore, SqliteStore
from swiftlm.server.completions.chat_protocol import ChatCompletionRequest
from swiftlm.server.completions.completion_protocol import CompletionRequest
from swiftlm.server.model_identity import model_identity

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 8}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cache_over(store, **limits) -> tuple[ResponseCache, Clock]:
    clock = Clock()
    limits = {"ttl_s": 60.0, "max_entries": 100, "max_bytes": 1 << 20, **limits}
    return ResponseCache(store, "identity", clock=clock, **limits), clock


def key(response_cache: ResponseCache, caller: str = "k1", **fields) -> str:
    return response_cache.key("chat", "m", caller, ChatCompletionRequest.model_validate({**BODY, **fields}))


def test_key_ignores_what_cannot_change_the_answer() -> None:
    cache, _ = cache_over(MemoryStore())
    base = key(cache)
    for fields in ({"stream": True}, {"stream": True, "stream_options": {"include_usage": True}}, {"user": "u1"},
                   {"request_id": "r1"}, {"cache": True}, {"extra_body": {"user": "u2"}}, {"top_p": None}):
        assert key(cache, **fields) == base, fields


@pytest.mark.parametrize("fields", [
    {"messages": [{"role": "user", "content": "hi!"}]}, {"max_tokens": 9}, {"temperature": 0.5, "seed": 1},
    {"seed": 2}, {"stop": ["x"]}, {"logprobs": True}, {"enable_thinking": False}, {"n": 2},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, {"response_format": {"type": "json_object"}},
    {"chat_template_kwargs": {"enable_thinking": "auto"}}, {"ignore_eos": True}, {"top_k": 5}, {"logit_bias": {"1": 2}},
])
def test_key_changes_with_every_output_field(fields: dict) -> None:
    cache, _ = cache_over(MemoryStore())
    assert key(cache, **fields) != key(cache)


def test_key_is_private_to_the_caller_and_bound_to_the_model() -> None:
    cache, _ = cache_over(MemoryStore())
    assert key(cache, "k1") != key(cache, "k2")
    other = ResponseCache(MemoryStore(), "other identity", 60.0, 100, 1 << 20)
    assert key(other) != key(cache)
    assert cache.key("completions", "m", "k1", CompletionRequest(prompt="hi")) != cache.key(
        "completions", "m2", "k1", CompletionRequest(prompt="hi"))


def test_only_deterministic_requests_and_the_opt_outs() -> None:
    assert is_deterministic(SamplingParams(temperature=0.0))
    assert is_deterministic(SamplingParams(temperature=0.7, seed=3))
    assert not is_deterministic(SamplingParams(temperature=0.7))
    req = ChatCompletionRequest.model_validate(BODY)
    assert not bypasses_cache(req, {})
    assert bypasses_cache(req, {"cache-control": "no-cache"})
    assert bypasses_cache(req, {"cache-control": "max-age=0, no-store"})
    assert bypasses_cache(ChatCompletionRequest.model_validate({**BODY, "cache": False}), {})
    assert bypasses_cache(ChatCompletionRequest.model_validate({**BODY, "session_id": "s"}), {})


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path):
    store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "cache.sqlite")
    yield store
    store.close()


def test_ttl(store) -> None:
    cache, clock = cache_over(store, ttl_s=10.0)
    cache.put("a", {"v": 1})
    clock.now += 9
    assert cache.get("a") == {"v": 1}
    clock.now += 2  # 11 s after it was stored: expired, and dropped
    assert cache.get("a") is None
    assert (cache.stats().hits, cache.stats().misses, cache.stats().entries) == (1, 1, 0)


def test_lru_by_entries(store) -> None:
    cache, clock = cache_over(store, max_entries=2)
    for name in ("a", "b"):
        cache.put(name, {"v": name})
        clock.now += 1
    assert cache.get("a") is not None  # a is now the most recently used
    clock.now += 1
    cache.put("c", {"v": "c"})
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    assert cache.stats().entries == 2


def test_lru_by_bytes(store) -> None:
    one = len(b'{"v":"' + b"x" * 100 + b'"}')
    cache, clock = cache_over(store, max_bytes=2 * one + 10)
    for name in ("a", "b", "c"):
        cache.put(name, {"v": "x" * 100})
        clock.now += 1
    assert cache.get("a") is None and cache.get("b") is not None and cache.get("c") is not None
    assert cache.stats().bytes == 2 * one
    cache.put("huge", {"v": "x" * 10_000})  # larger than the whole cache: not stored, nothing evicted
    assert cache.get("huge") is None and cache.stats().entries == 2


def test_sqlite_survives_a_restart_and_a_corrupt_file_is_rebuilt(tmp_path: Path, caplog) -> None:
    path = tmp_path / "cache.sqlite"
    cache, _ = cache_over(SqliteStore(path))
    cache.put("a", {"v": 1})
    cache.close()
    again, _ = cache_over(SqliteStore(path))
    assert again.get("a") == {"v": 1}
    again.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.write_bytes(b"this is not a database" * 100)
    with caplog.at_level(logging.WARNING, logger="swiftlm.server.response_cache"):
        rebuilt, _ = cache_over(SqliteStore(path))
    assert "unreadable" in caplog.text and str(path) in caplog.text
    assert rebuilt.get("a") is None
    rebuilt.put("b", {"v": 2})
    assert rebuilt.get("b") == {"v": 2}
    rebuilt.close()


def test_model_identity_follows_the_weight_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"0" * 64)
    config = SimpleNamespace(model=str(tmp_path), gguf_file=None, device="cpu", quantization=None,
                             cache=SimpleNamespace(kv_cache_dtype="auto"), chat_template=None, generation_overrides={})
    engine = SimpleNamespace(config=config, source=SimpleNamespace(gguf=None), dtype="torch.float32", model_dir=tmp_path)
    first = model_identity(engine)
    assert model_identity(engine) == first
    weights.write_bytes(b"1" * 64)
    os.utime(weights, ns=(1, 1))  # other weights, same size: the mtime differs
    assert model_identity(engine) != first
    moved = model_identity(engine)
    config.quantization = "int8"
    assert model_identity(engine) != moved


def test_chat_answer_round_trips_through_chunks() -> None:
    answer = {
        "object": "chat.completion", "model": "m", "thinking": "auto:on",
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
                  "prompt_tokens_details": {"cached_tokens": 0}},
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hello ✓", "reasoning": "hm",
                                     "reasoning_content": "hm"}, "finish_reason": "stop"},
            {"index": 1, "message": {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
             "finish_reason": "tool_calls"},
        ],
    }
    events = list(chat_hit_events(answer, "chatcmpl-x", include_usage=True))
    assert events[-1] == "data: [DONE]\n\n"
    chunks = [c for e in events for c in parse_events(e)]
    assert all(c["id"] == "chatcmpl-x" for c in chunks)
    assert chunks[0]["swiftlm"] == {"cache": "hit", "computed_tokens": 0, "thinking": "auto:on"}
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 5
    again = chat_answer_from_chunks(chunks)
    assert again["choices"] == answer["choices"]


def test_completion_answer_round_trips_through_chunks() -> None:
    answer = {"object": "text_completion", "model": "m",
              "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
              "choices": [{"index": 0, "text": "ab", "finish_reason": "length",
                           "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-1.0, -2.0],
                                        "top_logprobs": [None, None], "text_offset": [0, 1]}}]}
    events = list(completion_hit_events(answer, "cmpl-x", include_usage=False))
    chunks = [c for e in events for c in parse_events(e)]
    assert not any("usage" in c for c in chunks)
    assert completion_answer_from_chunks(chunks)["choices"] == answer["choices"]


def test_a_stream_is_kept_only_when_it_completes() -> None:
    import asyncio

    from swiftlm.server.answer_cache.answers import recorded

    usage = 'data: {"choices": [], "usage": {"prompt_tokens": 1}}\n\n'

    async def events(error: bool = False):
        yield 'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
        yield 'data: {"error": {"message": "boom"}}\n\n' if error else usage
        yield "data: [DONE]\n\n"

    async def run(stream, take: int | None = None) -> tuple[list[str], list]:
        kept: list = []
        out: list[str] = []
        wrapped = recorded(stream, kept.append, include_usage=False)
        async for event in wrapped:
            out.append(event)
            if take is not None and len(out) == take:
                await wrapped.aclose()
                break
        return out, kept

    out, kept = asyncio.run(run(events()))
    assert usage not in out and len(kept) == 1  # the usage chunk is kept, not sent unasked
    assert asyncio.run(run(events(error=True)))[1] == []
    assert asyncio.run(run(events(), take=1))[1] == []  # the client left early
