"""Article 001's LangChain calls against ``swiftlm serve --served-model-name Qwen/Qwen3-0.6B Qwen-0.6B``
on the scripted checkpoint."""

from __future__ import annotations

import pytest

from tests.conftest import ANSWER, REASONING
from tests.reference import article_001
from tests.reference.conftest import THINKING_TOKENS


def test_streaming_with_thinking_returns_the_answer_only(reference_server) -> None:
    before = reference_server.generation_tokens()
    response = article_001.langchain_streaming(reference_server.v1)
    assert response.content == ANSWER
    assert "<think>" not in response.content and REASONING not in response.content
    assert reference_server.generated_since(before, THINKING_TOKENS) == THINKING_TOKENS  # thinking ran


def test_bounded_generation_from_the_environment(reference_server, monkeypatch: pytest.MonkeyPatch) -> None:
    """§5.2 names no server: LangChain takes it from OPENAI_API_BASE (the base URL, changed)."""
    monkeypatch.setenv("OPENAI_API_BASE", reference_server.v1)
    monkeypatch.setenv("OPENAI_API_KEY", "EMPTY")
    chat_model = article_001.bounded_generation()
    before = reference_server.generation_tokens()
    response = chat_model.invoke("你是谁？")  # §5.1's call
    assert response.content == ANSWER
    assert reference_server.generated_since(before, THINKING_TOKENS) == THINKING_TOKENS  # thinking on by default
