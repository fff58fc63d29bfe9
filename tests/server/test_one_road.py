"""One road from the routes to the engine: a request is validated once, and its text (detokenising,
stop strings, the reasoning split) is made in the server's thread, never on the engine loop's.

The scripted checkpoint answers "<think>Hmm, okay</think>\\n\\nHello there!" (tests/conftest.py)."""

from __future__ import annotations

import threading

import httpx
import pytest
from openai import OpenAI

import swiftlm.engine.engine as engine_module
from swiftlm.text.reasoning import ReasoningStreamParser
from swiftlm.text.stop import StopStringMatcher
from swiftlm.text.tokenizer import Tokenizer

ENGINE_THREAD = "swiftlm-engine"
USER = [{"role": "user", "content": "你是谁？"}]


@pytest.fixture(scope="module")
def server(start_server, scripted_model_dir):
    return start_server(scripted_model_dir)


def test_text_is_made_off_the_engine_loop_thread(server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every decode, stop-string match and reasoning split of streamed, whole and n=2 answers runs in
    the server's threads; the engine loop only steps (and the answers are cut at the stop string)."""
    threads: dict[str, set[str]] = {"decode": set(), "stop": set(), "reasoning": set()}

    def spy(kind: str, fn):
        def wrapped(*args, **kwargs):
            threads[kind].add(threading.current_thread().name)
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(Tokenizer, "decode", spy("decode", Tokenizer.decode))
    monkeypatch.setattr(StopStringMatcher, "feed", spy("stop", StopStringMatcher.feed))
    monkeypatch.setattr(ReasoningStreamParser, "feed", spy("reasoning", ReasoningStreamParser.feed))
    client = OpenAI(base_url=server.v1, api_key="x")
    whole = client.chat.completions.create(model=server.model, messages=USER, temperature=0, stop=["there"])
    assert (whole.choices[0].message.content, whole.choices[0].finish_reason) == ("Hello ", "stop")
    chunks = client.chat.completions.create(model=server.model, messages=USER, temperature=0, stop=["there"],
                                            stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == "Hello "
    two = client.completions.create(model=server.model, prompt="hi", max_tokens=6, n=2, temperature=0,
                                    stop=["e"])
    assert len(two.choices) == 2 and all("e" not in c.text for c in two.choices)
    assert threads["decode"] and threads["stop"] and threads["reasoning"], threads
    assert all(ENGINE_THREAD not in names for names in threads.values()), threads
    server.assert_no_leaks()


def test_a_request_is_validated_once(server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chat and completions requests pass the engine's one validation once each (once per prompt of a
    completions request), accepted or refused; a refusal is the 400 that names the field."""
    calls: list[int] = []
    check = engine_module.validate_request

    def counted(ids, params, limits):
        calls.append(len(ids))
        return check(ids, params, limits)

    monkeypatch.setattr(engine_module, "validate_request", counted)
    r = httpx.post(server.v1 + "/chat/completions", json={"messages": USER, "max_tokens": 4}, timeout=30)
    assert r.status_code == 200 and len(calls) == 1, (r.text, calls)
    r = httpx.post(server.v1 + "/completions", json={"prompt": ["a", "b"], "max_tokens": 2}, timeout=30)
    assert r.status_code == 200 and len(calls) == 3, (r.text, calls)
    r = httpx.post(server.v1 + "/chat/completions", json={"messages": USER, "max_tokens": 10**6}, timeout=30)
    error = r.json()["error"]
    assert r.status_code == 400 and len(calls) == 4
    assert (error["param"], error["code"]) == ("max_tokens", "context_length_exceeded")
    r = httpx.post(server.v1 + "/completions", json={"prompt": [1, 10**7]}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt" and len(calls) == 5


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_ends_the_session_turn_where_the_client_saw_it(server, stream: bool) -> None:
    """The engine may run a step or two past a stop string the server finds; the session keeps only the
    tokens up to it, so the next turn extends what the client was sent."""
    session = f"stop-{stream}"
    body = {"messages": USER, "temperature": 0, "stop": ["there"], "session_id": session, "stream": stream,
            "chat_template_kwargs": {"enable_thinking": False}}
    r = httpx.post(server.v1 + "/chat/completions", json=body, timeout=30)
    assert r.status_code == 200
    tokens = server.run_in_engine(lambda e: next(s.token_ids for s in e.kv.sessions.all()
                                                  if s.session_id.endswith(session)))
    tokenizer = server.engine.tokenizer
    assert tokenizer.decode(tokens, skip_special_tokens=False).endswith("Hello there")
    server.assert_no_leaks()
