"""Fixtures for the bench tests: the real Qwen3 tokenizer's length function, a fake server."""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.bench.fake_openai import ServerThread, create_app

TOKENIZER_GZ = Path(__file__).resolve().parent.parent / "assets" / "qwen3_tokenizer" / "tokenizer.json.gz"


@pytest.fixture(scope="session")
def count_tokens() -> Callable[[str], int]:
    import tokenizers

    backend = tokenizers.Tokenizer.from_str(gzip.open(TOKENIZER_GZ).read().decode())
    return lambda text: len(backend.encode(text, add_special_tokens=False).ids)


@pytest.fixture(scope="module")
def fake_server() -> Iterator[ServerThread]:
    with ServerThread(create_app()) as server:
        yield server


@pytest.fixture()
def fake(fake_server: ServerThread) -> ServerThread:
    """The module's fake server with its request log cleared."""
    fake_server.app.state.bodies.clear()
    fake_server.app.state.counter = 0
    return fake_server
