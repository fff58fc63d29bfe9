"""Article 000's LangChain calls, its raw-HTTP OptimizedQwenClient, its A/B loop and presets,
against ``swiftlm serve --served-model-name Qwen/Qwen3-0.6B Qwen-0.6B`` on the scripted checkpoint.

Whether thinking ran is read from the server's generated-token counter: the scripted checkpoint
writes THINKING_TOKENS tokens with thinking on and ANSWER_TOKENS with it off.
"""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import ANSWER
from tests.reference import article_000
from tests.reference.conftest import ANSWER_TOKENS, THINKING_TOKENS


def test_thinking_off_without_streaming(reference_server) -> None:
    before = reference_server.generation_tokens()
    response = article_000.thinking_off(reference_server.v1)
    assert response.content == ANSWER
    assert reference_server.generated_since(before, ANSWER_TOKENS) == ANSWER_TOKENS  # thinking was off


def test_optimized_client_second_turn_continues_the_session(reference_server) -> None:
    before = reference_server.generation_tokens()
    first, second = article_000.optimized_client_two_turns(reference_server.v1)
    for data in (first, second):
        assert "choices" in data, data
        assert data["choices"][0]["message"]["content"] == ANSWER
    # the nested "extra_body" turned thinking off in both turns
    assert first["usage"]["completion_tokens"] == ANSWER_TOKENS
    assert reference_server.generated_since(before, 2 * ANSWER_TOKENS) == 2 * ANSWER_TOKENS

    # turn 2 sent only "刚才说了什么？"; its prompt also holds turn 1 (question and answer)
    alone = httpx.post(reference_server.base_url + "/tokenize", json={
        "model": "Qwen-0.6B", "messages": [{"role": "user", "content": "刚才说了什么？"}],
        "chat_template_kwargs": {"enable_thinking": False},
    }, timeout=10)  # fmt: skip
    assert alone.status_code == 200, alone.text
    usage1, usage2 = first["usage"], second["usage"]
    assert usage2["prompt_tokens"] > alone.json()["count"]
    assert usage2["prompt_tokens"] > usage1["prompt_tokens"] + usage1["completion_tokens"]
    # and turn 1's tokens were not computed again
    cached = (usage2.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    assert cached >= usage1["prompt_tokens"], usage2


def test_use_cache_and_decoding_switches(reference_server) -> None:
    chat_model = article_000.cache_and_decoding(reference_server.v1)
    before = reference_server.generation_tokens()
    assert chat_model.invoke("你是谁？").content == ANSWER
    assert reference_server.generated_since(before, ANSWER_TOKENS) == ANSWER_TOKENS


def test_short_and_focused_sampling(reference_server) -> None:
    chat_model = article_000.short_and_focused(reference_server.v1)
    before = reference_server.generation_tokens()
    response = chat_model.invoke("你是谁？")
    assert response.content == ANSWER
    assert reference_server.generated_since(before, ANSWER_TOKENS) == ANSWER_TOKENS


def test_ab_loop_runs_both_configs(reference_server, capsys: pytest.CaptureFixture[str]) -> None:
    """The default config streams with thinking on, the optimised one is whole with thinking off;
    every request of both succeeds (the latency numbers are not checked)."""
    before = reference_server.generation_tokens()
    default_result, opt_result = article_000.ab_test(reference_server.v1)
    out = capsys.readouterr().out
    assert "请求失败" not in out, out
    assert default_result["success_rate"] == 1.0 and opt_result["success_rate"] == 1.0
    assert "延迟降低" in out
    expected = 10 * THINKING_TOKENS + 10 * ANSWER_TOKENS
    assert reference_server.generated_since(before, expected) == expected


@pytest.mark.parametrize("name", ["faq", "copywriting"])
def test_single_turn_presets(reference_server, name: str) -> None:
    before = reference_server.generation_tokens()
    response = article_000.preset_model(reference_server.v1, name).invoke("你是谁？")
    assert response.content == ANSWER
    assert reference_server.generated_since(before, ANSWER_TOKENS) == ANSWER_TOKENS


def test_assistant_preset_keeps_the_conversation(reference_server) -> None:
    """§4.3: the same session_id on each call, each call sending only its new question."""
    chat_model = article_000.preset_model(reference_server.v1, "assistant")
    first = chat_model.invoke("你好")
    second = chat_model.invoke("刚才说了什么？")
    assert first.content == ANSWER and second.content == ANSWER
    usage1 = first.response_metadata["token_usage"]
    usage2 = second.response_metadata["token_usage"]
    assert usage2["prompt_tokens"] > usage1["prompt_tokens"] + usage1["completion_tokens"]
    assert (usage2.get("prompt_tokens_details") or {}).get("cached_tokens", 0) >= usage1["prompt_tokens"]
