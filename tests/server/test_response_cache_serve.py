"""The response cache and automatic thinking on a real server, through the openai client.

One server (the scripted checkpoint, a SQLite cache, two API keys, --default-thinking auto) answers
most tests; three more starts check a restart on one file (hit) and other weights beside it (miss).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from safetensors.torch import load_file, save_file

from swiftlm.config import ApiKeySpec, ServerConfig
from tests.conftest import make_scripted_model
from tests.server.conftest import ANSWER, REASONING

KEYS = (ApiKeySpec("sk-one", name="one"), ApiKeySpec("sk-two", name="two"))


@pytest.fixture(scope="module")
def cache_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("response_cache") / "answers.sqlite"


def cache_config(cache_file: Path, **fields) -> ServerConfig:
    return ServerConfig(api_keys=KEYS, response_cache=f"sqlite:{cache_file}", default_thinking="auto", **fields)


@pytest.fixture(scope="module")
def server(start_server, scripted_model_dir, cache_file):
    return start_server(scripted_model_dir, cache_config(cache_file, auto_thinking_budget=2))


def client(server, key: str = "sk-one") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key=key, max_retries=0)


EXTENSIONS = ("enable_thinking", "ignore_eos", "cache", "session_id", "chat_template_kwargs")


def sdk_fields(fields: dict) -> dict:
    """``fields`` as the openai SDK takes them: swiftlm's extensions moved into ``extra_body``."""
    extra = {**(fields.pop("extra_body", None) or {}), **{k: fields.pop(k) for k in EXTENSIONS if k in fields}}
    fields.setdefault("temperature", 0)
    return {**fields, "extra_body": extra or None}


def ask(server, content: str = "What does a cache do?", key: str = "sk-one", **fields):
    """(x-swiftlm-cache header, the parsed completion)."""
    raw = client(server, key).chat.completions.with_raw_response.create(
        model=server.model, messages=[{"role": "user", "content": content}], max_tokens=20, **sdk_fields(fields))
    return raw.headers.get("x-swiftlm-cache"), raw.parse()


def ask_streamed(server, content: str = "What does a cache do?", key: str = "sk-one", **fields):
    """(header, content, reasoning, the chunks' swiftlm fields, usage)."""
    raw = client(server, key).chat.completions.with_raw_response.create(
        model=server.model, messages=[{"role": "user", "content": content}], max_tokens=20, stream=True,
        stream_options={"include_usage": True}, **sdk_fields(fields))
    text, reasoning, extensions, usage = [], [], [], None
    for chunk in raw.parse():
        if (chunk.model_extra or {}).get("swiftlm"):
            extensions.append(chunk.model_extra["swiftlm"])
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            reasoning.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
    return raw.headers.get("x-swiftlm-cache"), "".join(text), "".join(reasoning), extensions, usage


def metric(server, name: str) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_repeated_deterministic_request_is_a_hit_whole_and_streamed(server) -> None:
    status, miss = ask(server, enable_thinking=True)
    assert status == "miss" and miss.model_extra["swiftlm"] == {"thinking": "on", "cache": "miss"}
    assert miss.choices[0].message.content == ANSWER
    hits_before = metric(server, "swiftlm:response_cache_hits")
    status, hit = ask(server, enable_thinking=True, user="someone else's label")  # user cannot change the answer
    assert status == "hit"
    assert hit.choices[0].message.content.encode() == miss.choices[0].message.content.encode()
    assert hit.choices[0].message.model_extra["reasoning_content"] == REASONING
    assert hit.id != miss.id
    assert hit.model_extra["swiftlm"] == {"cache": "hit", "computed_tokens": 0, "thinking": "on"}
    assert hit.usage.prompt_tokens == miss.usage.prompt_tokens
    assert hit.usage.completion_tokens == miss.usage.completion_tokens
    assert hit.usage.prompt_tokens_details.cached_tokens == hit.usage.prompt_tokens
    assert metric(server, "swiftlm:response_cache_hits") == hits_before + 1
    # the same request streamed: replayed from the whole answer's entry
    status, text, reasoning, extensions, usage = ask_streamed(server, enable_thinking=True)
    assert status == "hit" and text.encode() == ANSWER.encode() and reasoning == REASONING
    assert extensions == [{"cache": "hit", "computed_tokens": 0, "thinking": "on"}]
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens


def test_streamed_miss_then_streamed_and_whole_hits(server) -> None:
    status, text, reasoning, extensions, usage = ask_streamed(server, "Name a colour, please.", enable_thinking=True)
    assert status == "miss" and extensions == [{"thinking": "on", "cache": "miss"}]
    status, again, again_reasoning, _, again_usage = ask_streamed(server, "Name a colour, please.", enable_thinking=True)
    assert status == "hit" and again.encode() == text.encode() and again_reasoning == reasoning
    assert again_usage.completion_tokens == usage.completion_tokens
    status, whole = ask(server, "Name a colour, please.", enable_thinking=True)
    assert status == "hit" and whole.choices[0].message.content == text


def test_sampled_requests_without_a_seed_are_never_cached(server) -> None:
    entries = metric(server, "swiftlm:response_cache_entries")
    for _ in range(2):
        status, _ = ask(server, "Pick a number.", temperature=1.0)
        assert status == "bypass"
    assert metric(server, "swiftlm:response_cache_entries") == entries
    assert [ask(server, "Pick a number.", temperature=1.0, seed=7)[0] for _ in range(2)] == ["miss", "hit"]


@pytest.mark.parametrize("fields", [
    {"max_tokens": 19}, {"enable_thinking": False}, {"stop": ["there"]}, {"seed": 3}, {"logprobs": True},
    {"extra_body": {"ignore_eos": True}}, {"messages": [{"role": "user", "content": "What does a cache do"}]},
    {"tools": [{"type": "function", "function": {"name": "look_up", "parameters": {"type": "object"}}}]},
])
def test_changing_an_output_field_misses(server, fields: dict) -> None:
    base = {"model": server.model, "messages": [{"role": "user", "content": "What does a cache do?"}],
            "max_tokens": 20, "temperature": 0, "enable_thinking": True}
    first = client(server).chat.completions.with_raw_response.create(**sdk_fields(dict(base)))
    assert first.headers["x-swiftlm-cache"] in ("miss", "hit")
    changed = client(server).chat.completions.with_raw_response.create(**sdk_fields({**base, **fields}))
    assert changed.headers["x-swiftlm-cache"] == "miss", fields


def test_another_api_key_misses(server) -> None:
    assert ask(server, "Whose answer is this?")[0] == "miss"
    assert ask(server, "Whose answer is this?")[0] == "hit"
    assert ask(server, "Whose answer is this?", key="sk-two")[0] == "miss"


def test_opt_outs_and_sessions_bypass(server) -> None:
    assert ask(server, "Opt out?")[0] == "miss"
    assert ask(server, "Opt out?", extra_body={"cache": False})[0] == "bypass"
    raw = client(server).chat.completions.with_raw_response.create(
        model=server.model, messages=[{"role": "user", "content": "Opt out?"}], max_tokens=20, temperature=0,
        extra_headers={"Cache-Control": "no-cache"})
    assert raw.headers["x-swiftlm-cache"] == "bypass"
    assert ask(server, "Opt out?", extra_body={"session_id": "s-1"})[0] == "bypass"
    assert ask(server, "Opt out?")[0] == "hit"


def test_completions_hit_whole_and_streamed(server) -> None:
    one = client(server)
    miss = one.completions.with_raw_response.create(model=server.model, prompt="Once upon", max_tokens=6, temperature=0)
    hit = one.completions.with_raw_response.create(model=server.model, prompt="Once upon", max_tokens=6, temperature=0)
    assert (miss.headers["x-swiftlm-cache"], hit.headers["x-swiftlm-cache"]) == ("miss", "hit")
    assert hit.parse().choices[0].text == miss.parse().choices[0].text
    assert hit.parse().usage.prompt_tokens_details.cached_tokens == miss.parse().usage.prompt_tokens
    streamed = one.completions.with_raw_response.create(
        model=server.model, prompt="Once upon", max_tokens=6, temperature=0, stream=True)
    assert streamed.headers["x-swiftlm-cache"] == "hit"
    assert "".join(c.choices[0].text for c in streamed.parse() if c.choices) == miss.parse().choices[0].text


def respond(server, text: str, key: str = "sk-one", **fields):
    """(x-swiftlm-cache header, the parsed response) of POST /v1/responses."""
    raw = client(server, key).responses.with_raw_response.create(
        model=server.model, input=text, max_output_tokens=20, **sdk_fields(fields))
    return raw.headers.get("x-swiftlm-cache"), raw.parse()


def respond_streamed(server, text: str, **fields):
    """(header, the events' types, the output text deltas joined, the final response)."""
    raw = client(server).responses.with_raw_response.create(
        model=server.model, input=text, max_output_tokens=20, stream=True, **sdk_fields(fields))
    events = list(raw.parse())
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    return raw.headers.get("x-swiftlm-cache"), [e.type for e in events], deltas, events[-1].response


def output_of(response) -> list[tuple[str, str]]:
    """Each output item's type and text (reasoning, message) or call."""
    out = []
    for item in response.output:
        if item.type == "function_call":
            out.append((item.type, f"{item.name}({item.arguments})"))
        else:
            out.append((item.type, "".join(part.text for part in item.content or [])))
    return out


def test_responses_hit_whole_and_streamed_and_stored(server) -> None:
    status, miss = respond(server, "What does a response cache keep?", enable_thinking=True)
    assert status == "miss" and miss.output_text == ANSWER
    hits_before = metric(server, "swiftlm:response_cache_hits")
    status, hit = respond(server, "What does a response cache keep?", enable_thinking=True, metadata={"run": "two"})
    assert status == "hit" and hit.id != miss.id and hit.status == "completed"
    assert output_of(hit) == output_of(miss) and any(kind == "reasoning" for kind, _ in output_of(hit))
    assert hit.output_text.encode() == miss.output_text.encode()
    assert hit.metadata == {"run": "two"}  # the response object is this request's, the answer the entry's
    assert (hit.usage.input_tokens, hit.usage.output_tokens) == (miss.usage.input_tokens, miss.usage.output_tokens)
    assert hit.usage.input_tokens_details.cached_tokens == hit.usage.input_tokens
    assert metric(server, "swiftlm:response_cache_hits") == hits_before + 1
    # stored like any response (store defaults to true): retrievable, and a chain can go on from it
    assert output_of(client(server).responses.retrieve(hit.id)) == output_of(hit)
    status, next_turn = respond(server, "And then?", previous_response_id=hit.id)
    assert status == "bypass" and next_turn.output_text == ANSWER  # continuing a stored chain reaches its session
    # the same request streamed: the events replayed from the entry
    status, kinds, deltas, final = respond_streamed(server, "What does a response cache keep?", enable_thinking=True)
    assert status == "hit" and deltas == ANSWER and final.output_text == ANSWER
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert output_of(final) == output_of(miss)
    assert final.usage.input_tokens_details.cached_tokens == final.usage.input_tokens


def test_responses_streamed_miss_then_whole_hit_and_opt_outs(server) -> None:
    status, _, deltas, final = respond_streamed(server, "Stream it first.", enable_thinking=False)
    assert status == "miss" and deltas == ANSWER
    status, whole = respond(server, "Stream it first.", enable_thinking=False)
    assert status == "hit" and output_of(whole) == output_of(final)
    assert respond(server, "Stream it first.", enable_thinking=False, cache=False)[0] == "bypass"
    assert respond(server, "Stream it first.", enable_thinking=False, key="sk-two")[0] == "miss"  # private to a key
    # the key is the whole conversation: other instructions, or another output bound, miss
    assert respond(server, "Stream it first.", enable_thinking=False, instructions="Be brief.")[0] == "miss"
    raw = client(server).responses.with_raw_response.create(
        model=server.model, input="Stream it first.", max_output_tokens=19, temperature=0,
        extra_body={"enable_thinking": False})
    assert raw.headers["x-swiftlm-cache"] == "miss"
    sampled = client(server).responses.with_raw_response.create(
        model=server.model, input="Stream it first.", max_output_tokens=20, temperature=1.0,
        extra_body={"enable_thinking": False})
    assert sampled.headers["x-swiftlm-cache"] == "bypass"


def test_auto_thinking_decides_per_question_and_says_so(server) -> None:
    off = metric(server, 'swiftlm:thinking_auto_decisions_total{decision="off"')
    on = metric(server, 'swiftlm:thinking_auto_decisions_total{decision="on"')
    _, greeting = ask(server, "你好", extra_body={"enable_thinking": "auto"}, extra_headers={"Cache-Control": "no-cache"})
    assert greeting.model_extra["swiftlm"]["thinking"] == "auto:off"
    assert greeting.choices[0].message.content == ANSWER
    assert greeting.choices[0].message.model_extra.get("reasoning_content") is None
    assert greeting.usage.completion_tokens_details.reasoning_tokens == 0
    # the server's default is auto: a request that does not choose is decided by the rules too
    _, derive = ask(server, "推导爱因斯坦质能方程", extra_headers={"Cache-Control": "no-cache"})
    assert derive.model_extra["swiftlm"]["thinking"] == "auto:on"
    # --auto-thinking-budget 2 applies to "auto" thinking: two reasoning tokens, then </think> is forced
    assert derive.usage.completion_tokens_details.reasoning_tokens <= 3
    assert derive.choices[0].message.content == ANSWER
    assert metric(server, 'swiftlm:thinking_auto_decisions_total{decision="off"') == off + 1
    assert metric(server, 'swiftlm:thinking_auto_decisions_total{decision="on"') == on + 1
    # an explicit choice wins over the server's auto, and is reported as such
    _, explicit = ask(server, "你好", enable_thinking=True, extra_headers={"Cache-Control": "no-cache"})
    assert explicit.model_extra["swiftlm"]["thinking"] == "on"
    assert explicit.choices[0].message.model_extra["reasoning_content"] == REASONING
    _, _, _, extensions, _ = ask_streamed(server, "推导爱因斯坦质能方程", extra_body={"chat_template_kwargs": {
        "enable_thinking": "auto"}}, extra_headers={"Cache-Control": "no-cache"})
    assert extensions[0]["thinking"] == "auto:on"


def test_auto_thinking_in_tokenize_and_bad_values(server) -> None:
    headers = {"Authorization": "Bearer sk-one"}
    body = {"model": server.model, "messages": [{"role": "user", "content": "你好"}], "enable_thinking": "auto"}
    r = httpx.post(server.base_url + "/tokenize", json=body, headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    off = httpx.post(server.base_url + "/tokenize", json={**body, "enable_thinking": False}, headers=headers, timeout=10)
    assert r.json()["tokens"] == off.json()["tokens"]  # the template rendered "auto" as the decision, off
    r = httpx.post(server.v1 + "/chat/completions", json={**body, "enable_thinking": "maybe"}, headers=headers,
                   timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "enable_thinking"


def test_restart_on_the_sqlite_file_hits_and_other_weights_miss(start_server, tmp_path_factory) -> None:
    model_dir = make_scripted_model(tmp_path_factory.mktemp("restarted_model"))
    cache_file = tmp_path_factory.mktemp("restart_cache") / "answers.sqlite"
    first_server = start_server(model_dir, cache_config(cache_file))
    status, first = ask(first_server, "Remember me across restarts.")
    assert status == "miss"
    restarted = start_server(model_dir, cache_config(cache_file))
    status, again = ask(restarted, "Remember me across restarts.")
    assert status == "hit" and again.choices[0].message.content == first.choices[0].message.content
    # other weights in the same directory: another model identity, so the stored answer is not served
    weights = model_dir / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 1.5
    save_file(tensors, str(weights), metadata={"format": "pt"})
    other = start_server(model_dir, cache_config(cache_file))
    assert ask(other, "Remember me across restarts.")[0] == "miss"
