"""``tool_choice`` "required" and a named function on a random checkpoint (any output possible):
constrained decoding makes every answer well-formed calls whose arguments validate against the
function's schema, whole and streamed; the openai SDK and LangChain against the real server."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import openai
import pydantic
import pytest
from langchain_core.tools import tool as langchain_tool
from langchain_openai import ChatOpenAI

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
NAMED = {"type": "function", "function": {"name": "get_time"}}


@pytest.fixture(scope="module")
def server(start_server, tiny_tied_dir):
    return start_server(tiny_tied_dir, max_model_len=1024, max_num_seqs=16)


def body(server, **fields) -> dict:
    return {
        "model": server.model, "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
        "enable_thinking": False, "max_tokens": 300, "temperature": 1.0, **fields,
    }


def assert_valid_calls(calls: list[dict], names: set[str], at_most_one: bool) -> None:
    assert calls, "no tool calls"
    assert not at_most_one or len(calls) == 1
    for call in calls:
        assert call["function"]["name"] in names
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])


async def _whole(server, payload: dict) -> dict:
    async with httpx.AsyncClient(timeout=120) as client:
        r = await client.post(server.v1 + "/chat/completions", json=payload)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]


async def _streamed(server, payload: dict) -> dict:
    """The streamed answer folded into a whole choice, as the openai SDK folds it."""
    calls: dict[int, dict] = {}
    content, finish = "", None
    async with httpx.AsyncClient(timeout=120) as client, client.stream(
        "POST", server.v1 + "/chat/completions", json={**payload, "stream": True}
    ) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            content += choice["delta"].get("content") or ""
            finish = choice.get("finish_reason") or finish
            for piece in choice["delta"].get("tool_calls") or ():
                call = calls.setdefault(piece["index"], {"function": {"name": None, "arguments": ""}})
                if "id" in piece:
                    assert call["function"]["name"] is None and piece["type"] == "function"
                    call["id"], call["function"]["name"] = piece["id"], piece["function"]["name"]
                call["function"]["arguments"] += piece["function"].get("arguments") or ""
    return {"message": {"content": content or None, "tool_calls": [calls[i] for i in sorted(calls)]}, "finish_reason": finish}


CHOICES = [
    ("required, one call", {"tool_choice": "required", "parallel_tool_calls": False}, {"get_weather", "get_time"}, True),
    ("required, parallel", {"tool_choice": "required"}, {"get_weather", "get_time"}, False),
    ("named", {"tool_choice": NAMED, "parallel_tool_calls": False}, {"get_time"}, True),
]


# answers of each kind (whole, streamed) per case: the CI form's 3, 6 with -m slow
@pytest.mark.parametrize("per_kind", [3, pytest.param(6, marks=pytest.mark.slow)])
@pytest.mark.parametrize(("what", "fields", "names", "one"), CHOICES, ids=[c[0] for c in CHOICES])
def test_every_answer_is_valid_calls(server, what: str, fields: dict, names: set[str], one: bool,
                                     per_kind: int) -> None:
    async def main() -> list[dict]:
        jobs = [_whole(server, body(server, seed=s, **fields)) for s in range(per_kind)]
        jobs += [_streamed(server, body(server, seed=100 + s, **fields)) for s in range(per_kind)]
        return await asyncio.gather(*jobs)

    for choice in asyncio.run(main()):
        assert choice["finish_reason"] == "tool_calls", choice
        assert choice["message"]["content"] is None
        assert_valid_calls(choice["message"]["tool_calls"], names, one)


def test_openai_sdk_tools_required(server) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="EMPTY")
    reply = client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "hi"}], tools=TOOLS, tool_choice=NAMED,
        parallel_tool_calls=False, max_tokens=300, extra_body={"enable_thinking": False},
    )
    calls = [call.model_dump() for call in reply.choices[0].message.tool_calls]
    assert_valid_calls(calls, {"get_time"}, True)


class Weather(pydantic.BaseModel):
    """No other fields: a random model would otherwise write extra keys until max_tokens."""

    model_config = pydantic.ConfigDict(extra="forbid")
    city: str = pydantic.Field(max_length=8)
    days: int = pydantic.Field(ge=1, le=7)


def _llm(server) -> ChatOpenAI:
    return ChatOpenAI(
        model=server.model, base_url=server.v1, api_key="EMPTY", max_tokens=300, temperature=0.0,
        extra_body={"enable_thinking": False},
    )


def test_langchain_bind_tools_required(server) -> None:
    @langchain_tool
    def get_weather(city: str, days: int) -> str:
        """The weather in a city for some days."""
        return "sunny"

    reply = _llm(server).bind_tools([get_weather], tool_choice="required").invoke("Weather in Paris?")
    assert [c["name"] for c in reply.tool_calls][:1] == ["get_weather"]
    assert all(isinstance(c["args"]["city"], str) and isinstance(c["args"]["days"], int) for c in reply.tool_calls)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(server, method: str) -> None:
    result = _llm(server).with_structured_output(Weather, method=method).invoke("Weather in Paris?")
    assert isinstance(result, Weather)
