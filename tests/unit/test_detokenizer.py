"""The incremental detokenizer must reproduce the full decode without ever splitting a character."""

from __future__ import annotations

import random

import pytest

from swiftlm.text.detokenizer import IncrementalDetokenizer
from swiftlm.text.tokenizer import Tokenizer

TEXTS = {
    "chinese": "今天天气很好，我们去公园散步吧。量子纠缠是一种奇特的物理现象。",
    "emoji": "Hi 😀🎉🙏🏽 ok",
    "zwj_family_flags_skin": "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 🇯🇵🇫🇷 flags, 👋🏿👍🏻 tones, ❤️‍🔥",
    "mixed_code": 'def 问候(名字):\n    return f"你好, {名字}! 🐍"  # 注释 ✓\n\nprint(问候("世界"))\n',
    "rare_cjk": "𠜎𠜱𠝹𠱓 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∑∫√ Ελληνικά русский",
}


def _stream(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    deltas = [detok.add(i) for i in ids]
    deltas.append(detok.flush())
    return deltas


@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
def test_token_by_token_equals_full_decode(qwen3_tokenizer: Tokenizer, text: str) -> None:
    ids = qwen3_tokenizer.encode(text)
    assert len(ids) > 5
    detok = IncrementalDetokenizer(qwen3_tokenizer)
    deltas = _stream(detok, ids)
    assert "".join(deltas) == qwen3_tokenizer.decode(ids) == text
    assert detok.text == text
    assert not any("\ufffd" in d for d in deltas)


def test_multi_byte_characters_are_held_then_released(qwen3_tokenizer: Tokenizer) -> None:
    text = "👨\u200d👩"  # the zero-width joiner's three bytes span two byte-level tokens
    ids = qwen3_tokenizer.encode(text)
    detok = IncrementalDetokenizer(qwen3_tokenizer)
    deltas = []
    for i in ids:
        deltas.append(detok.add(i))
        if deltas[-1] == "":
            assert detok.num_pending_tokens == 1
    assert deltas == ["👨", "", "\u200d", "👩"]
    assert detok.num_pending_tokens == 0
    assert detok.flush() == ""


def test_prompt_context_does_not_leak(qwen3_tokenizer: Tokenizer) -> None:
    prompt = qwen3_tokenizer.apply_chat_template([{"role": "user", "content": "用中文回答 🙂"}])
    prompt_ids = qwen3_tokenizer.encode(prompt)
    ids = qwen3_tokenizer.encode("好的！这是答案 ✅")
    detok = IncrementalDetokenizer(qwen3_tokenizer, prompt_token_ids=prompt_ids)
    assert "".join(_stream(detok, ids)) == "好的！这是答案 ✅"


def test_add_tokens_in_chunks(qwen3_tokenizer: Tokenizer) -> None:
    text = TEXTS["zwj_family_flags_skin"] + TEXTS["mixed_code"]
    ids = qwen3_tokenizer.encode(text)
    detok = IncrementalDetokenizer(qwen3_tokenizer)
    deltas = [detok.add_tokens(ids[i : i + 3]) for i in range(0, len(ids), 3)] + [detok.flush()]
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_special_tokens(qwen3_tokenizer: Tokenizer, skip_special_tokens: bool) -> None:
    text = "<think>\n想一想 🤔\n</think>\n\n答案是 42。<|im_end|>"
    ids = qwen3_tokenizer.encode(text)
    detok = IncrementalDetokenizer(qwen3_tokenizer, skip_special_tokens=skip_special_tokens)
    deltas = _stream(detok, ids)
    out = "".join(deltas)
    assert out == qwen3_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    assert not any("\ufffd" in d for d in deltas)
    # <think> and </think> are added but not special tokens: they are kept either way
    assert "<think>" in out and "</think>" in out
    assert ("<|im_end|>" in out) is (not skip_special_tokens)


def test_flush_emits_truly_invalid_trailing_bytes(qwen3_tokenizer: Tokenizer) -> None:
    ids = qwen3_tokenizer.encode("ab\u200d")
    truncated = ids[:-1]  # the joiner's first two bytes, without its last one
    full = qwen3_tokenizer.decode(truncated)
    assert full.endswith("\ufffd")
    detok = IncrementalDetokenizer(qwen3_tokenizer)
    deltas = _stream(detok, truncated)
    assert "".join(deltas) == full
    assert "\ufffd" not in "".join(deltas[:-1])


def _multibyte_token_ids(tokenizer: Tokenizer) -> list[int]:
    """Ids of byte-level tokens that are pieces of Chinese characters and emoji (or whole ones)."""
    sample = (
        "".join(TEXTS.values())
        + "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出要就下得可你年生"
    )
    ids = set(tokenizer.encode(sample))
    for ch in set(sample):
        ids.update(tokenizer.encode(ch))
    return sorted(i for i in ids if any(ord(c) > 127 for c in tokenizer.convert_ids_to_tokens([i])[0] or ""))


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_multibyte_sequences(qwen3_tokenizer: Tokenizer, skip_special_tokens: bool) -> None:
    # Random sequences contain invalid UTF-8; the full decode then has U+FFFD too, and the
    # concatenated deltas must still equal it.
    pool = _multibyte_token_ids(qwen3_tokenizer)
    assert len(pool) > 50
    extra = qwen3_tokenizer.encode("<|im_end|><think> a the\n")
    for seed in range(150):
        rng = random.Random(seed)
        ids = [
            rng.choice(pool) if rng.random() < 0.9 else rng.choice(extra) for _ in range(rng.randint(1, 40))
        ]
        detok = IncrementalDetokenizer(qwen3_tokenizer, skip_special_tokens=skip_special_tokens)
        deltas = _stream(detok, ids)
        assert "".join(deltas) == qwen3_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens), seed


def _byte_token(tokenizer: Tokenizer, byte: int) -> int:
    """The byte-level BPE token of one raw byte (GPT-2's byte-to-unicode alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = [b for b in range(256) if b not in printable]
    char = chr(byte) if byte in printable else chr(256 + extra.index(byte))
    token = tokenizer.token_id(char)
    assert token is not None
    return token


def test_invalid_bytes_stream_instead_of_waiting_for_the_end(qwen3_tokenizer: Tokenizer) -> None:
    """A run of lone lead bytes (a broken or random model) decodes to U+FFFDs that can never
    complete except for the last one: they are emitted as they come, not held to the end."""
    lead = _byte_token(qwen3_tokenizer, 0xF0)
    ids = [lead] * 6 + qwen3_tokenizer.encode("ok 😀") + [lead, _byte_token(qwen3_tokenizer, 0x9F)]
    detok = IncrementalDetokenizer(qwen3_tokenizer)
    deltas = _stream(detok, ids)
    assert "".join(deltas) == qwen3_tokenizer.decode(ids)
    assert deltas[1] == "\ufffd"  # the first lead byte is final as soon as the second arrives
    assert "".join(deltas[:6]) == "\ufffd" * 5  # the sixth may still start a character
    assert deltas[-1] == "\ufffd"  # the unfinished F0 9F comes out at the flush
