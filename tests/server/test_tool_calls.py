"""Tool calls over HTTP: parsed into message.tool_calls, streamed in OpenAI's delta shape,
tool_choice none / auto, the 400s, and the openai SDK and LangChain reading the calls.

A scripted checkpoint (tests/conftest.py) answers with text and one hermes call:
"Hello there!<tool_call>{...}</tool_call>" (after "<think>Hmm, okay</think>\\n\\n" with thinking on).
"""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

import httpx
import openai
import pytest
from langchain_core.tools import tool as langchain_tool
from langchain_openai import ChatOpenAI

from swiftlm.config import ServerConfig
from tests.conftest import ANSWER, REASONING, SCRIPT, make_scripted_model
from tests.helpers.tokenizer_files import ASSET_DIR

ARGUMENTS = {"city": "Paris"}
CALL_JSON = '{"name":"get_weather","arguments":{"city": "Paris"}}'
RAW_CALL = f"<tool_call>{CALL_JSON}</tool_call>"
TOOL_CALL, TOOL_CALL_END, IM_END = 151657, 151658, 151645
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]


@functools.cache
def _qwen3_tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_str(gzip.decompress((ASSET_DIR / "tokenizer.json.gz").read_bytes()).decode())


def script(call_json: str) -> list[int]:
    """The scripted chain with the answer "Hello there!" followed by a call written as `call_json`."""
    ids = _qwen3_tokenizer().encode(call_json, add_special_tokens=False).ids
    return [*SCRIPT[:-1], TOOL_CALL, *ids, TOOL_CALL_END, IM_END]


@pytest.fixture(scope="module")
def tool_model_dir(tmp_path_factory) -> Path:
    return make_scripted_model(tmp_path_factory.mktemp("scripted_tool"), script(CALL_JSON))


@pytest.fixture(scope="module")
def server(start_server, tool_model_dir):
    return start_server(tool_model_dir)


def chat(server, **body) -> httpx.Response:
    body.setdefault("messages", [{"role": "user", "content": "Weather in Paris?"}])
    return httpx.post(server.v1 + "/chat/completions", json={"model": server.model, **body}, timeout=60)


def stream_chat(server, **body) -> list[dict]:
    body.setdefault("messages", [{"role": "user", "content": "Weather in Paris?"}])
    chunks = []
    with httpx.stream("POST", server.v1 + "/chat/completions", json={"model": server.model, "stream": True, **body},
                      timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


@pytest.mark.parametrize("thinking", [True, False])
def test_whole_answer_has_the_call_and_the_text(server, thinking: bool) -> None:
    r = chat(server, tools=TOOLS, chat_template_kwargs={"enable_thinking": thinking})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls"
    assert message["content"] == ANSWER
    assert message.get("reasoning_content") == (REASONING if thinking else None)
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == ARGUMENTS


@pytest.mark.parametrize("thinking", [True, False])
def test_streamed_answer_follows_openais_delta_shape(server, thinking: bool) -> None:
    chunks = stream_chat(server, tools=TOOLS, chat_template_kwargs={"enable_thinking": thinking})
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    content = "".join(d.get("content") or "" for d in deltas)
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    pieces = [tc for d in deltas for tc in d.get("tool_calls") or ()]
    assert content == ANSWER
    assert reasoning == (REASONING if thinking else "")
    assert "<tool_call>" not in content
    first, *rest = pieces
    assert first["index"] == 0 and first["type"] == "function" and first["id"].startswith("call_")
    assert first["function"]["name"] == "get_weather"
    assert all(set(p) == {"index", "function"} and set(p["function"]) == {"arguments"} for p in rest)
    arguments = first["function"].get("arguments", "") + "".join(p["function"]["arguments"] for p in rest)
    assert json.loads(arguments) == ARGUMENTS
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"


@pytest.mark.parametrize("body", [{"tools": TOOLS, "tool_choice": "none"}, {}], ids=["tool_choice none", "no tools"])
def test_nothing_is_parsed_without_tools_on_offer(server, body: dict) -> None:
    r = chat(server, chat_template_kwargs={"enable_thinking": False}, **body)
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == ANSWER + RAW_CALL
    assert "tool_calls" not in choice["message"] and choice["finish_reason"] == "stop"


def test_tool_choice_none_leaves_the_tools_out_of_the_prompt(server) -> None:
    counts = [chat(server, tools=TOOLS, tool_choice=choice).json()["usage"]["prompt_tokens"] for choice in ("none", "auto")]
    assert counts[0] == chat(server).json()["usage"]["prompt_tokens"] < counts[1]


def test_a_call_cut_by_max_tokens_is_content_with_finish_length(server) -> None:
    r = chat(server, tools=TOOLS, max_tokens=6, chat_template_kwargs={"enable_thinking": False})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"].startswith(ANSWER + "<tool_call>")


def test_tool_call_parser_none_keeps_the_calls_as_text(start_server, tool_model_dir) -> None:
    plain = start_server(tool_model_dir, ServerConfig(tool_call_parser="none"))
    choice = chat(plain, tools=TOOLS, chat_template_kwargs={"enable_thinking": False}).json()["choices"][0]
    assert choice["message"]["content"] == ANSWER + RAW_CALL and choice["finish_reason"] == "stop"
    r = chat(plain, tools=TOOLS, tool_choice="required")
    assert r.status_code == 400 and "--tool-call-parser none" in r.json()["error"]["message"]


def test_malformed_call_is_content_and_counted(start_server, tmp_path_factory) -> None:
    bad = start_server(make_scripted_model(tmp_path_factory.mktemp("scripted_bad_call"), script('{"name":"get_weather",')))
    for stream in (False, True):
        if stream:
            chunks = stream_chat(bad, tools=TOOLS, chat_template_kwargs={"enable_thinking": False})
            content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
            assert not any(c["choices"][0]["delta"].get("tool_calls") for c in chunks if c["choices"])
        else:
            message = chat(bad, tools=TOOLS, chat_template_kwargs={"enable_thinking": False}).json()["choices"][0]["message"]
            content = message["content"]
            assert "tool_calls" not in message
        assert content == ANSWER + '<tool_call>{"name":"get_weather",</tool_call>'
    metrics = httpx.get(bad.base_url + "/metrics").text
    assert 'swiftlm:tool_call_parse_errors_total{model_name="swiftlm-test"} 2.0' in metrics


BAD_TOOL_BODIES = [
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "name"),
    ({"tools": [{"type": "function", "function": {"name": " "}}]}, "name is empty"),
    ({"tools": [*TOOLS, *TOOLS]}, "given twice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}, "type \"object\""),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}, "parameters"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'nope'"),
    ({"tool_choice": "required"}, "needs tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "needs tools"),
]


@pytest.mark.parametrize(("body", "says"), BAD_TOOL_BODIES)
def test_bad_tools_are_400_naming_the_problem(server, body: dict, says: str) -> None:
    r = chat(server, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert says in error["message"]
    assert chat(server, tools=TOOLS).status_code == 200  # and the server keeps serving


def test_openai_sdk_reads_the_calls(server) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="EMPTY")
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    reply = client.chat.completions.create(model=server.model, messages=messages, tools=TOOLS)
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == ARGUMENTS
    with client.chat.completions.stream(model=server.model, messages=messages, tools=TOOLS) as stream:
        final = stream.get_final_completion()
    (streamed,) = final.choices[0].message.tool_calls
    assert streamed.function.name == "get_weather" and json.loads(streamed.function.arguments) == ARGUMENTS
    # the round trip: the call and its result go back, and the server renders them
    messages += [reply.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'}]
    again = client.chat.completions.create(model=server.model, messages=messages, tools=TOOLS)
    assert again.choices[0].finish_reason == "tool_calls"


def test_a_session_continues_with_the_tool_results(server) -> None:
    first = chat(server, tools=TOOLS, session_id="tools-1").json()
    (call,) = first["choices"][0]["message"]["tool_calls"]
    result = [{"role": "tool", "tool_call_id": call["id"], "content": '{"temp": 21}'}]
    second = chat(server, tools=TOOLS, session_id="tools-1", messages=result).json()
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"] - 2
    assert second["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("streaming", [False, True])
def test_langchain_bind_tools(server, streaming: bool) -> None:
    @langchain_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    llm = ChatOpenAI(model=server.model, base_url=server.v1, api_key="EMPTY", temperature=0.0, streaming=streaming)
    reply = llm.bind_tools([get_weather]).invoke("Weather in Paris?")
    assert [(c["name"], c["args"]) for c in reply.tool_calls] == [("get_weather", ARGUMENTS)]
    assert reply.content == ANSWER


def test_each_of_n_streamed_choices_gets_its_own_call(server) -> None:
    chunks = stream_chat(server, tools=TOOLS, n=2, chat_template_kwargs={"enable_thinking": False})
    for i in range(2):
        choices = [c for chunk in chunks for c in chunk["choices"] if c["index"] == i]
        pieces = [p for c in choices for p in c["delta"].get("tool_calls") or ()]
        assert "".join(c["delta"].get("content") or "" for c in choices) == ANSWER
        assert [p["function"].get("name") for p in pieces] == ["get_weather", None]
        assert json.loads("".join(p["function"]["arguments"] for p in pieces)) == ARGUMENTS
        assert [c["finish_reason"] for c in choices if c["finish_reason"]] == ["tool_calls"]
