"""The Responses API (/v1/responses) against the real server: the openai SDK whole and streamed,
stored responses (retrieve, delete, input items, private to the key), a chain of turns on one KV
session (prompts equal to the chat session's, cached tokens covering the earlier turns) that
survives a restart, tool_choice "required" and json_schema on a random checkpoint, LangChain's
ChatOpenAI(use_responses_api=True), the reasoning item with thinking on, and the 400s / 404s."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from langchain_core.tools import tool as langchain_tool
from langchain_openai import ChatOpenAI

from tests.reference.conftest import ServeProcess, spawn_serve
from tests.server.conftest import ANSWER, REASONING, free_port

NO_THINKING = {"enable_thinking": False}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The weather", "parameters": WEATHER}


@pytest.fixture(scope="module")
def server(start_server, scripted_model_dir):
    return start_server(scripted_model_dir)


@pytest.fixture(scope="module")
def random_server(start_server, tiny_tied_dir):
    return start_server(tiny_tied_dir, max_model_len=1024)


def client_of(server, key: str = "EMPTY") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key=key)


# ---------------------------------------------------------------- 1. the openai SDK


def test_sdk_create_whole_and_streamed_retrieve_delete_input_items(server) -> None:
    client = client_of(server)
    whole = client.responses.create(model=server.model, input="hi", temperature=0, extra_body=NO_THINKING,
                                    metadata={"case": "one"})
    assert whole.object == "response" and whole.status == "completed" and whole.id.startswith("resp_")
    assert whole.output_text == ANSWER
    assert [item.type for item in whole.output] == ["message"]
    assert whole.usage.output_tokens == 4 and whole.usage.output_tokens_details.reasoning_tokens == 0
    assert whole.usage.total_tokens == whole.usage.input_tokens + 4
    assert whole.metadata == {"case": "one"}

    events = list(client.responses.create(model=server.model, input="hi", temperature=0, stream=True,
                                          extra_body=NO_THINKING))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"} and len(kinds[4:-4]) >= 2
    final = events[-1].response
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == events[-4].text == ANSWER
    assert final.usage.output_tokens == 4 and final.status == "completed"

    with client.responses.stream(model=server.model, input="hi", temperature=0, extra_body=NO_THINKING) as helper:
        assert helper.get_final_response().output_text == ANSWER  # the SDK's accumulating helper agrees

    for made in (whole, final):
        got = client.responses.retrieve(made.id)
        assert got.id == made.id and got.output_text == ANSWER and got.usage == made.usage
    items = client.responses.input_items.list(whole.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [("message", "user", "hi")]
    assert items.data[0].id.startswith("msg_")

    with pytest.raises(openai.NotFoundError):  # another key cannot see it
        client_of(server, "another-key").responses.retrieve(whole.id)
    with pytest.raises(openai.NotFoundError):
        client_of(server, "another-key").responses.delete(whole.id)
    client.responses.delete(whole.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(whole.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(whole.id)
    not_stored = client.responses.create(model=server.model, input="hi", store=False, extra_body=NO_THINKING)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(not_stored.id)
    server.assert_no_leaks()


def test_unknown_ids_are_404_and_unsupported_input_is_a_400_naming_it(server) -> None:
    url = server.v1 + "/responses"
    r = httpx.post(url, json={"input": "hi", "previous_response_id": "resp_nope"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"
    cases = {
        "web_search": {"input": "hi", "tools": [{"type": "web_search"}]},
        "input_image": {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
        "item_reference": {"input": [{"type": "item_reference", "id": "msg_1"}]},
        "max_tool_calls": {"input": "hi", "max_tool_calls": 3},
        "encrypted_content": {"input": [{"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"}]},
        "truncation": {"input": "hi", "truncation": "auto"},
    }
    for name, body in cases.items():
        r = httpx.post(url, json=body)
        assert r.status_code == 400, (name, r.text)
        assert name in r.json()["error"]["message"] or name in (r.json()["error"]["param"] or ""), (name, r.text)
    for path in ("/responses/resp_nope", "/responses/resp_nope/input_items"):
        assert httpx.get(server.v1 + path).status_code == 404
    assert httpx.delete(server.v1 + "/responses/resp_nope").status_code == 404


# ---------------------------------------------------------------- 2. a chain of turns


QUESTIONS = ["What is the capital of France?", "And of Italy?", "Which of the two is larger?"]


def _chain(client: openai.OpenAI, model: str, previous: str | None = None) -> list:
    out = []
    for question in QUESTIONS:
        resp = client.responses.create(model=model, input=question, previous_response_id=previous, temperature=0,
                                       instructions="Answer briefly.", extra_body=NO_THINKING)
        assert resp.status == "completed"
        previous = resp.id
        out.append(resp)
    return out


def test_chain_continues_on_the_kv_session_and_equals_the_chat_session(server) -> None:
    client = client_of(server)
    turns = _chain(client, server.model)
    chat, messages = [], [{"role": "system", "content": "Answer briefly."}]
    for question in QUESTIONS:  # the chat endpoint on a session, sent the whole conversation each turn
        messages.append({"role": "user", "content": question})
        reply = client.chat.completions.create(model=server.model, messages=messages, temperature=0,
                                               extra_body={**NO_THINKING, "session_id": "chat-twin"})
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        chat.append(reply)
    cached = [t.usage.input_tokens_details.cached_tokens for t in turns]
    print("responses chain: input_tokens", [t.usage.input_tokens for t in turns], "cached_tokens", cached)
    for turn, reply in zip(turns, chat, strict=True):
        assert turn.output_text == reply.choices[0].message.content == ANSWER
        assert turn.usage.input_tokens == reply.usage.prompt_tokens  # the same prompt as the chat session's
    for before, after in zip(turns, turns[1:], strict=False):  # all earlier tokens but the last few
        seen = before.usage.input_tokens + before.usage.output_tokens
        assert seen - 2 <= after.usage.input_tokens_details.cached_tokens <= seen
    items = client.responses.input_items.list(turns[2].id)
    assert [i.content[0].text for i in items.data] == [QUESTIONS[2]]  # this turn's input only
    # the chain's KV session released (as memory pressure would): the next turn renders the stored items
    closed = httpx.delete(f"{server.v1}/sessions/responses.{turns[0].id}", headers={"Authorization": "Bearer EMPTY"})
    assert closed.status_code == 200, closed.text
    after = client.responses.create(model=server.model, input="Thanks.", previous_response_id=turns[2].id,
                                    temperature=0, instructions="Answer briefly.", extra_body=NO_THINKING)
    assert after.status == "completed" and after.output_text == ANSWER
    seen = turns[2].usage.input_tokens + turns[2].usage.output_tokens
    assert after.usage.input_tokens_details.cached_tokens < seen - 2
    server.assert_no_leaks()


def _serve(model_dir: Path, storage: Path, log_dir: Path) -> ServeProcess:
    port = free_port()
    server = spawn_serve(["serve", str(model_dir), "--port", str(port), "--served-model-name", "swiftlm-test",
                          "--batch-storage-dir", str(storage), "--response-retention-hours", "1"], port, log_dir)
    assert server.wait_healthy() == 200, server.log()
    return server


def _stop(server: ServeProcess) -> None:
    server.terminate()
    server.wait_stopped()


def _first_server(model_dir: Path, storage: Path):
    """The server before the restart, in this process (the one ``swiftlm serve`` child of the test is
    the server after it): the same storage flags; returns its /v1 URL and a function that stops it
    (uvicorn stops, then the engine)."""
    from swiftlm.config import ServerConfig
    from swiftlm.engine.async_engine import AsyncEngine
    from swiftlm.engine.engine import Engine
    from swiftlm.llm import engine_config
    from swiftlm.server.app import create_app
    from tests.server.conftest import run_uvicorn

    config = ServerConfig(served_model_names=("swiftlm-test",), batch_storage_dir=str(storage),
                          response_retention_hours=1.0)
    engine = AsyncEngine(Engine(engine_config(str(model_dir), "auto", "cpu")))
    port = free_port()
    server, thread = run_uvicorn(create_app(engine, config, str(model_dir)), config, port)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=10)
        engine.shutdown(drain_timeout_s=1)

    return f"http://127.0.0.1:{port}/v1", stop


def test_chain_survives_a_restart(scripted_model_dir, tmp_path) -> None:
    """A server stopped, then ``swiftlm serve`` started on the same storage: a new process, an empty
    KV cache, the stored chain. (The server before the restart runs in the test's process: a second
    child process would cost ~6 s of start; SIGTERM's graceful stop is test_sessions_metrics'.)"""
    storage = tmp_path / "storage"
    v1, stop = _first_server(scripted_model_dir, storage)
    try:
        first = openai.OpenAI(base_url=v1, api_key="EMPTY").responses.create(
            model="swiftlm-test", input=QUESTIONS[0], temperature=0, extra_body=NO_THINKING)
    finally:
        stop()
    server = _serve(scripted_model_dir, storage, tmp_path)
    try:
        client = openai.OpenAI(base_url=server.v1, api_key="EMPTY")
        second = client.responses.create(model="swiftlm-test", input=QUESTIONS[1], previous_response_id=first.id,
                                         temperature=0, extra_body=NO_THINKING)
        assert second.status == "completed" and second.output_text == ANSWER, server.log()
        assert second.usage.input_tokens_details.cached_tokens == 0  # nothing of it was in the new cache
        fresh = client.chat.completions.create(  # the conversation rendered from the stored items
            model="swiftlm-test", temperature=0, extra_body=NO_THINKING,
            messages=[{"role": "user", "content": QUESTIONS[0]}, {"role": "assistant", "content": ANSWER},
                      {"role": "user", "content": QUESTIONS[1]}],
        )
        assert second.usage.input_tokens == fresh.usage.prompt_tokens
        third = client.responses.create(model="swiftlm-test", input=QUESTIONS[2], previous_response_id=second.id,
                                        temperature=0, extra_body=NO_THINKING)
        seen = second.usage.input_tokens + second.usage.output_tokens
        assert third.usage.input_tokens_details.cached_tokens >= seen - 2  # on the session again
        assert client.responses.retrieve(first.id).output_text == ANSWER
    finally:
        _stop(server)


# ---------------------------------------------------------------- 3. tools and json_schema on random weights


def test_required_tool_and_json_schema_validate_on_a_random_checkpoint(random_server) -> None:
    client = client_of(random_server)
    for seed in range(3):
        for stream in (False, True):
            kwargs = dict(model=random_server.model, input=f"weather {seed}", tools=[WEATHER_TOOL],
                          tool_choice="required", parallel_tool_calls=False, max_output_tokens=200, temperature=1.0,
                          extra_body={**NO_THINKING, "seed": seed})
            if stream:
                events = list(client.responses.create(stream=True, **kwargs))
                resp = events[-1].response
                done = [e for e in events if e.type == "response.function_call_arguments.done"]
                assert [e.arguments for e in done] == [i.arguments for i in resp.output if i.type == "function_call"]
            else:
                resp = client.responses.create(**kwargs)
            calls = [item for item in resp.output if item.type == "function_call"]
            assert len(calls) == 1 and calls[0].name == "get_weather", resp.output
            jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    follow = client.responses.create(
        model=random_server.model, previous_response_id=resp.id, max_output_tokens=8, extra_body=NO_THINKING,
        tools=[WEATHER_TOOL],  # tools are not inherited from the previous response (as in OpenAI)
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temp": 21}'}],
    )
    assert follow.status in ("completed", "incomplete") and follow.output[-1].type in ("message", "function_call")
    assert follow.usage.input_tokens > resp.usage.input_tokens
    # a forced call on random weights does not extend the session's stream (chat's sessions do the
    # same: the answer is rendered fresh), so the reuse here is the prefix cache's whole blocks
    assert follow.usage.input_tokens_details.cached_tokens > 0
    fmt = {"type": "json_schema", "name": "weather", "schema": WEATHER, "strict": True}
    for seed in range(3):
        resp = client.responses.create(model=random_server.model, input="json please", text={"format": fmt},
                                       max_output_tokens=200, temperature=1.0, extra_body={**NO_THINKING, "seed": seed})
        assert resp.status == "completed", resp
        jsonschema.validate(json.loads(resp.output_text), WEATHER)
    random_server.assert_no_leaks()


# ---------------------------------------------------------------- 4. LangChain


@langchain_tool
def get_weather(city: str, days: int) -> str:
    """The weather in a city for some days."""
    return "sunny"


def test_langchain_responses_api(server, random_server) -> None:
    llm = ChatOpenAI(model=server.model, base_url=server.v1, api_key="EMPTY", temperature=0.0,
                     use_responses_api=True, extra_body=NO_THINKING)
    assert llm.invoke("hi").text == ANSWER
    chunks = [c.text for c in llm.stream("Tell me something")]
    assert "".join(chunks) == ANSWER and len([c for c in chunks if c]) >= 2
    assert llm.bind_tools([get_weather]).invoke("hi").text == ANSWER  # offered, not called
    first = llm.invoke("hi")
    assert llm.invoke([("human", "hi"), first, ("human", "again")]).text == ANSWER  # its history sent back as items
    forced = ChatOpenAI(model=random_server.model, base_url=random_server.v1, api_key="EMPTY", temperature=1.0,
                        use_responses_api=True, max_tokens=200, extra_body={**NO_THINKING, "seed": 1})
    reply = forced.bind_tools([get_weather], tool_choice="any", parallel_tool_calls=False).invoke("weather?")
    assert [call["name"] for call in reply.tool_calls] == ["get_weather"]
    assert {"city", "days"} <= set(reply.tool_calls[0]["args"])


# ---------------------------------------------------------------- 5. thinking


def test_reasoning_item_carries_the_thinking_whole_and_streamed(server) -> None:
    client = client_of(server)
    kwargs = dict(model=server.model, input="hi", temperature=0, reasoning={"effort": "medium"})
    whole = client.responses.create(**kwargs)
    assert [item.type for item in whole.output] == ["reasoning", "message"]
    assert whole.output[0].content[0].text.strip() == REASONING
    assert whole.output_text == ANSWER
    assert whole.usage.output_tokens_details.reasoning_tokens > 0
    events = list(client.responses.create(stream=True, **kwargs))
    final = events[-1].response
    assert [item.type for item in final.output] == ["reasoning", "message"]
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert reasoning == final.output[0].content[0].text and reasoning.strip() == REASONING
    assert text == final.output_text == ANSWER
    with client.responses.stream(**kwargs) as helper:
        assert [item.type for item in helper.get_final_response().output] == ["reasoning", "message"]
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "message"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
