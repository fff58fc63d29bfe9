"""Structured output on a random checkpoint: every answer parses and validates; bad constraints
are 400s; constrained neighbours do not change unconstrained greedy outputs."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import pytest

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8, "pattern": "^[a-z]+$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "minItems": 1, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 6}, "zip": {"type": "integer", "minimum": 1000, "maximum": 9999}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "color", "tags", "address"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}


@pytest.fixture(scope="module")
def server(start_server, tiny_tied_dir):
    return start_server(tiny_tied_dir, max_model_len=1024, max_num_seqs=32)


def _chat(server, **body) -> httpx.Response:
    body = {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "enable_thinking": False, **body}
    return httpx.post(server.v1 + "/chat/completions", json=body, timeout=120)


def _streamed_texts(server, n: int, seed: int) -> list[str]:
    body = {
        "model": server.model, "messages": [{"role": "user", "content": "hi"}], "enable_thinking": False,
        "response_format": FORMAT, "temperature": 1.0, "seed": seed, "n": n, "max_tokens": 300, "stream": True,
    }
    texts = [""] * n
    with httpx.stream("POST", server.v1 + "/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    texts[choice["index"]] += choice["delta"].get("content") or ""
    return texts


def _check_all(texts: list[str]) -> None:
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)


def test_json_schema_whole_and_streamed(server) -> None:
    """12 sampled answers, 8 whole and 4 streamed (the long form below: 200)."""
    r = _chat(server, response_format=FORMAT, temperature=1.0, seed=1, n=8, max_tokens=300)
    assert r.status_code == 200, r.text
    assert all(c["finish_reason"] == "stop" for c in r.json()["choices"])
    texts = [c["message"]["content"] for c in r.json()["choices"]]
    _check_all(texts)
    assert len(set(texts)) > 1  # the sampler varied the answers
    _check_all(_streamed_texts(server, 4, seed=3))


@pytest.mark.slow
def test_json_schema_hundred_answers(server) -> None:
    whole = []
    for seed in range(10):
        r = _chat(server, response_format=FORMAT, temperature=1.0, seed=100 + seed, n=10, max_tokens=300)
        whole += [c["message"]["content"] for c in r.json()["choices"]]
    streamed = [t for seed in range(10) for t in _streamed_texts(server, 10, seed=200 + seed)]
    assert len(whole) == len(streamed) == 100
    _check_all(whole + streamed)


@pytest.mark.parametrize(
    "fields",
    [
        {"guided_regex": "[a-c]{2,5}"},
        {"guided_choice": ["alpha", "beta"]},
        {"structured_outputs": {"choice": ["alpha", "beta"]}},
        {"grammar": 'root ::= "yes" | "no"'},
        {"guided_grammar": 'start: "x" "y" "y"?'},
        {"response_format": {"type": "json_object"}},
    ],
)
def test_other_constraints(server, fields) -> None:
    r = _chat(server, temperature=1.0, seed=5, max_tokens=200, **fields)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    text = choice["message"]["content"]
    if choice["finish_reason"] == "length":  # the one case whose text may not parse (any JSON object)
        assert "response_format" in fields and text.startswith("{")
        return
    if "guided_regex" in fields:
        assert 2 <= len(text) <= 5 and set(text) <= set("abc")
    elif "grammar" in fields:
        assert text in ("yes", "no")
    elif "guided_grammar" in fields:
        assert text in ("xy", "xyy")
    elif "response_format" in fields:
        assert isinstance(json.loads(text), dict)
    else:
        assert text in ("alpha", "beta")


@pytest.mark.parametrize(
    "fields",
    [
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "string"}}}}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        {"guided_regex": "(ab"},
        {"guided_grammar": "start: nowhere"},
        {"grammar": 'root ::= ( "a"'},
        {"guided_json": "{not json"},
        {"guided_regex": "a", "guided_choice": ["a"]},
    ],
)
def test_bad_constraints_are_400(server, fields) -> None:
    r = _chat(server, max_tokens=5, **fields)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert _chat(server, max_tokens=3).status_code == 200  # still serving


def test_completions_take_constraints(server) -> None:
    body = {"model": server.model, "prompt": "hi", "max_tokens": 300, "guided_json": SCHEMA, "temperature": 1.0, "seed": 9}
    r = httpx.post(server.v1 + "/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    _check_all([r.json()["choices"][0]["text"]])


def test_constrained_neighbours_leave_greedy_outputs_alone(server) -> None:
    prompts = [f"tell me about {w}" for w in ("cats", "dogs", "rain", "snow", "tea", "maps", "ice", "sand")]

    async def plain(client: httpx.AsyncClient, prompt: str) -> list[int]:
        body = {"model": server.model, "prompt": prompt, "max_tokens": 24, "temperature": 0.0, "ignore_eos": True,
                "logprobs": 0}
        r = await client.post(server.v1 + "/completions", json=body, timeout=120)
        return r.json()["choices"][0]["logprobs"]["tokens"]

    async def constrained(client: httpx.AsyncClient, seed: int) -> str:
        body = {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "enable_thinking": False,
                "response_format": FORMAT, "temperature": 1.0, "seed": seed, "max_tokens": 300}
        r = await client.post(server.v1 + "/chat/completions", json=body, timeout=120)
        return r.json()["choices"][0]["message"]["content"]

    async def run(mixed: bool) -> tuple[list[list[int]], list[str]]:
        async with httpx.AsyncClient() as client:
            jobs = [plain(client, p) for p in prompts] + ([constrained(client, s) for s in range(8)] if mixed else [])
            results = await asyncio.gather(*jobs)
        return list(results[: len(prompts)]), list(results[len(prompts):])

    alone, _ = asyncio.run(run(False))
    mixed, answers = asyncio.run(run(True))
    assert mixed == alone
    _check_all(answers)
