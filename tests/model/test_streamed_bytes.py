"""bench engine's decode bound: the bytes a decode step streams, the tied table counted once."""

from __future__ import annotations

from pathlib import Path

import pytest

from swiftlm import LLM
from swiftlm.bench.engine_bench import streamed_weight_bytes
from swiftlm.model.loader import load_model


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_streamed_bytes_count_every_weight_once(tiny_model_dir: Path, dtype: str) -> None:
    plain = load_model(tiny_model_dir, dtype)
    want = sum(p.numel() * p.element_size() for p in plain.parameters())  # parameters() dedups the tie
    if not plain.config.tie_word_embeddings:  # the untied table is gathered by rows, not streamed
        want -= plain.model.embed_tokens.weight.numel() * plain.model.embed_tokens.weight.element_size()
    llm = LLM(str(tiny_model_dir), dtype=dtype, kv_cache_memory=1 << 22)
    assert streamed_weight_bytes(llm.engine) == want
