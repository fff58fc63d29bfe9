"""Fixtures for the text-side unit tests: the real Qwen3 tokenizer, loaded once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from swiftlm.text.tokenizer import Tokenizer
from tests.helpers.tokenizer_files import write_generation_config, write_tokenizer_files


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tokenizer.json + tokenizer_config.json, without generation_config.json."""
    path = tmp_path_factory.mktemp("qwen3_tokenizer")
    write_tokenizer_files(path)
    return path


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir_with_generation_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tokenizer files plus Qwen3's real generation_config.json."""
    path = tmp_path_factory.mktemp("qwen3_tokenizer_gen")
    write_tokenizer_files(path)
    write_generation_config(path)
    return path


@pytest.fixture(scope="session")
def qwen3_tokenizer(qwen3_tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(qwen3_tokenizer_dir)
