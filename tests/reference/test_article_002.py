"""Article 002's client code: ``fast_invoke``, ``smart_invoke`` and ``streaming_thinking`` against
``swiftlm serve`` on the scripted checkpoint, and its offline ``LLM`` snippet on ``Qwen/Qwen3-0.6B``
resolved offline from a hub cache holding the scripted checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ANSWER, REASONING, SCRIPT
from tests.reference import article_002
from tests.reference.conftest import ANSWER_TOKENS, THINKING_TOKENS


@pytest.mark.parametrize("thinking", [True, False])
def test_fast_invoke(reference_server, thinking: bool, capsys: pytest.CaptureFixture[str]) -> None:
    article_002.connect(reference_server.v1)
    before = reference_server.generation_tokens()
    assert article_002.fast_invoke("用三句话解释量子纠缠", thinking=thinking) == ANSWER
    expected = THINKING_TOKENS if thinking else ANSWER_TOKENS
    assert reference_server.generated_since(before, expected) == expected
    assert "端到端耗时" in capsys.readouterr().out


@pytest.mark.parametrize("user_input,thinking", [("你好", False), ("推导爱因斯坦质能方程", True)])
def test_smart_invoke_turns_thinking_off_for_greetings(reference_server, user_input: str, thinking: bool) -> None:
    article_002.connect(reference_server.v1)
    before = reference_server.generation_tokens()
    assert article_002.smart_invoke(user_input) == ANSWER
    expected = THINKING_TOKENS if thinking else ANSWER_TOKENS
    assert reference_server.generated_since(before, expected) == expected


def test_streaming_thinking_reads_inline_think_tags(inline_think_server) -> None:
    """With ``--reasoning-parser none`` the think block streams inside ``delta.content``, which is
    where the article's parser looks for it."""
    article_002.connect(inline_think_server.v1)
    result = article_002.streaming_thinking([{"role": "user", "content": "123×45等于多少？"}])
    assert result["thinking"] == REASONING
    assert result["response"] == ANSWER


def test_offline_llm_snippet(hub_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import huggingface_hub.constants as hub_constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(hub_cache))
    prompts, outputs = article_002.offline_generate()
    assert len(outputs) == len(prompts)
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.prompt == prompt
        completion = output.outputs[0]
        # the scripted checkpoint follows its chain from wherever the prompt enters it, to <|im_end|>
        ids = list(completion.token_ids)
        assert completion.finish_reason == "stop", completion
        if ids and ids[-1] != SCRIPT[-1]:
            ids.append(SCRIPT[-1])
        assert 1 < len(ids) <= len(SCRIPT) and ids == SCRIPT[-len(ids):], ids
    out = capsys.readouterr().out
    assert out.count("Prompt: ") == 2 and out.count("Generated: ") == 2


def test_inline_batch_snippet_creates_a_job_that_completes(reference_server) -> None:
    """§4.1, as printed (only the base URL changed): the inline ``{"input": [...]}`` body."""
    import time

    import httpx

    response = article_002.submit_batch(reference_server.base_url)
    assert response.status_code == 200, response.text
    batch = response.json()
    assert batch["object"] == "batch" and batch["endpoint"] == "/v1/chat/completions"
    deadline = time.monotonic() + 120
    while batch["status"] not in ("completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
        batch = httpx.get(f"{reference_server.v1}/batches/{batch['id']}", timeout=10).json()
    assert batch["status"] == "completed" and batch["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    output = httpx.get(f"{reference_server.v1}/files/{batch['output_file_id']}/content", timeout=10).text
    lines = [json.loads(line) for line in output.splitlines()]
    assert sorted(line["custom_id"] for line in lines) == ["req_0", "req_1", "req_2"]
    assert all(line["response"]["status_code"] == 200 for line in lines)
