"""Tokenizer loading: special tokens, EOS ids, generation defaults, gzipped tokenizer.json."""

from __future__ import annotations

import shutil
from pathlib import Path

from swiftlm.text.tokenizer import Tokenizer
from tests.helpers.tokenizer_files import ASSET_DIR

IM_END, ENDOFTEXT, IM_START, THINK, END_THINK = 151645, 151643, 151644, 151667, 151668


def test_without_generation_config(qwen3_tokenizer: Tokenizer) -> None:
    tok = qwen3_tokenizer
    assert tok.vocab_size == 151669
    assert tok.eos_token_id == IM_END
    assert tok.eos_token_ids == (IM_END,)
    assert tok.pad_token_id == ENDOFTEXT
    assert tok.generation_defaults == {}
    assert tok.think_start_id == THINK and tok.think_end_id == END_THINK
    assert {IM_END, ENDOFTEXT, IM_START} <= tok.special_token_ids
    assert THINK not in tok.special_token_ids  # <think> is an added token, but not a special one
    assert tok.token_id("<|im_end|>") == IM_END and tok.token_id("no such token") is None
    assert tok.chat_template is not None and "enable_thinking" in tok.chat_template


def test_with_generation_config(qwen3_tokenizer_dir_with_generation_config: Path) -> None:
    tok = Tokenizer.from_dir(qwen3_tokenizer_dir_with_generation_config)
    assert tok.eos_token_ids == (IM_END, ENDOFTEXT)
    assert tok.generation_defaults == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": True}
    defaults = tok.generation_defaults
    defaults["temperature"] = 2.0
    assert tok.generation_defaults["temperature"] == 0.6  # a fresh copy each time


def test_loads_gzipped_tokenizer_json(tmp_path: Path, qwen3_tokenizer: Tokenizer) -> None:
    shutil.copyfile(ASSET_DIR / "tokenizer.json.gz", tmp_path / "tokenizer.json.gz")
    shutil.copyfile(ASSET_DIR / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    tok = Tokenizer.from_dir(tmp_path)
    text = "Hello 世界 👋 <think>x</think><|im_end|>"
    assert tok.encode(text) == qwen3_tokenizer.encode(text)


def test_encode_decode_roundtrip(qwen3_tokenizer: Tokenizer) -> None:
    tok = qwen3_tokenizer
    text = "<|im_start|>user\nHi 你好 🙂<|im_end|>\n<think>\n\n</think>"
    ids = tok.encode(text)
    assert ids[0] == IM_START and IM_END in ids and THINK in ids  # no BOS is added
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.decode(ids) == "user\nHi 你好 🙂\n<think>\n\n</think>"
    assert tok.convert_ids_to_tokens([IM_END, THINK]) == ["<|im_end|>", "<think>"]
