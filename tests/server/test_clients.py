"""The openai SDK and LangChain's ChatOpenAI against the real server, unchanged."""

from __future__ import annotations

import asyncio

import openai
import pytest
from langchain_openai import ChatOpenAI

from tests.server.conftest import ANSWER, REASONING


@pytest.fixture(scope="module")
def server(start_server, scripted_model_dir):
    return start_server(scripted_model_dir)


def test_langchain_thinking_streaming_invoke(server) -> None:
    llm = ChatOpenAI(
        model=server.model, base_url=server.v1, api_key="EMPTY", streaming=True, temperature=0.0,
        extra_body={"enable_thinking": True, "return_reasoning": True},
    )
    reply = llm.invoke("你是谁？")
    assert reply.content == ANSWER
    assert "<think>" not in reply.content and REASONING not in reply.content


def test_langchain_no_thinking_whole_answer(server) -> None:
    llm = ChatOpenAI(
        model=server.model, base_url=server.v1, api_key="EMPTY", streaming=False, temperature=0.0,
        extra_body={"enable_thinking": False},
    )
    reply = llm.invoke("你是谁？")
    assert reply.content == ANSWER
    usage = reply.response_metadata["token_usage"]
    assert usage["completion_tokens"] == 4  # Hello, there, !, <|im_end|>


def test_langchain_stream(server) -> None:
    llm = ChatOpenAI(
        model=server.model, base_url=server.v1, api_key="EMPTY", temperature=0.0,
        extra_body={"enable_thinking": False},
    )
    chunks = [c.content for c in llm.stream("Tell me something")]
    assert "".join(chunks) == ANSWER
    assert len([c for c in chunks if c]) >= 2  # streamed in pieces, not one block


@pytest.mark.parametrize("stream", [False, True])
def test_openai_sync(server, stream: bool) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="EMPTY")
    kwargs = dict(model=server.model, messages=[{"role": "user", "content": "hi"}], temperature=0,
                  extra_body={"enable_thinking": False})
    if stream:
        parts = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
        text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
        assert parts[-1].usage.completion_tokens == 4
    else:
        resp = client.chat.completions.create(**kwargs)
        text = resp.choices[0].message.content
        assert resp.choices[0].finish_reason == "stop"
        assert resp.usage.completion_tokens_details.reasoning_tokens == 0
    assert text == ANSWER


def test_repeated_prompt_reports_its_cached_tokens(server) -> None:
    """The second of two equal prompts reuses the KV the first one left in the prefix cache, and its
    usage counts those tokens: prompt[:P - 1], whole blocks and a copy of the block it ends inside
    (the last prompt token is computed again, for its logits)."""
    client = openai.OpenAI(base_url=server.v1, api_key="EMPTY")
    block_size = server.run_in_engine(lambda engine: engine.kv.block_size)
    content = "A prompt of a few KV blocks, sent twice: " + " ".join(f"word{i}" for i in range(40))
    kwargs = dict(model=server.model, messages=[{"role": "user", "content": content}], temperature=0,
                  extra_body={"enable_thinking": False})
    first = client.chat.completions.create(**kwargs)
    prompt_tokens = first.usage.prompt_tokens
    assert prompt_tokens > 2 * block_size  # at least two whole blocks to reuse
    # earlier prompts share at most the chat template's opening tokens with this one
    assert first.usage.prompt_tokens_details.cached_tokens < block_size
    parts = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    usage = parts[-1].usage
    assert usage.prompt_tokens == prompt_tokens
    rows = (prompt_tokens - 1) % block_size  # a partial match needs a quarter block
    reused = prompt_tokens - 1 - (rows if rows < block_size // 4 else 0)
    assert usage.prompt_tokens_details.cached_tokens == reused
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == ANSWER


def test_openai_async(server) -> None:
    async def main() -> tuple[str, str]:
        client = openai.AsyncOpenAI(base_url=server.v1, api_key="EMPTY")
        kwargs = dict(model=server.model, messages=[{"role": "user", "content": "hi"}], temperature=0,
                      extra_body={"enable_thinking": False})
        whole = await client.chat.completions.create(**kwargs)
        stream = await client.chat.completions.create(stream=True, **kwargs)
        parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        return whole.choices[0].message.content, "".join(parts)

    whole, streamed = asyncio.run(main())
    assert whole == streamed == ANSWER


def test_openai_completions(server) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="EMPTY")
    resp = client.completions.create(model=server.model, prompt="x\n", max_tokens=5, temperature=0)
    assert resp.choices[0].text == "<think>Hmm, okay</think>"
    streamed = client.completions.create(model=server.model, prompt="x\n", max_tokens=5, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == resp.choices[0].text
    models = client.models.list()
    assert [m.id for m in models.data] == [server.model]
    server.assert_no_leaks()
