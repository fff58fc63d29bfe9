"""Qwen3 reasoning split: whole-text and streaming forms must agree for every chunking."""

from __future__ import annotations

import itertools
import random

import pytest

from swiftlm.text.reasoning import ReasoningStreamParser, split_reasoning
from swiftlm.text.tokenizer import Tokenizer

# (text, thinking, reasoning, content)
EXAMPLES = [
    ("<think>\nLet me think.\n</think>\n\nThe answer is 4.", True, "Let me think.", "The answer is 4."),
    ("<think>\n\n</think>\n\nHi", True, None, "Hi"),
    ("a < b\n</think>\n\nyes", True, "a < b", "yes"),  # opening tag was in the prompt
    ("<think>\nstill going <thi", True, "still going <thi", ""),  # unterminated
    ("<think>\nhmm\n\n", True, "hmm", ""),
    ("<think>\n\nl1\n\n\nl2\n\n</think>\n\n\nx\n", True, "l1\n\n\nl2", "x\n"),
    (
        "<think>\n1<2, </b> <thin\n</think>\n\n<b>bold</b> a</ b<",
        True,
        "1<2, </b> <thin",
        "<b>bold</b> a</ b<",
    ),
    ("<think>\n让我想想……🤔\n</think>\n\n答案是四。", True, "让我想想……🤔", "答案是四。"),
    ("plain, no tags", True, "plain, no tags", ""),
    ("Hello <b>world</b> 1<2 </think", False, None, "Hello <b>world</b> 1<2 </think"),
    ("\n\nThe answer is 4.", False, None, "\n\nThe answer is 4."),
    ("", True, None, ""),
]


def _run_stream(chunks: list[str], thinking: bool) -> tuple[str, str]:
    parser = ReasoningStreamParser(thinking)
    reasoning, content = [], []
    for chunk in chunks:
        r, c = parser.feed(chunk)
        reasoning.append(r)
        content.append(c)
    r, c = parser.finish()
    return "".join(reasoning) + r, "".join(content) + c


def _chunkings(text: str):
    """Every chunking of short texts; for longer ones, every chunking with at most three cuts."""
    n = len(text)
    if n <= 14:
        cut_sets = itertools.chain.from_iterable(itertools.combinations(range(1, n), k) for k in range(n))
    else:
        cut_sets = itertools.chain.from_iterable(itertools.combinations(range(1, n), k) for k in range(4))
    for cuts in cut_sets:
        bounds = (0, *cuts, n)
        yield [text[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize(("text", "thinking", "reasoning", "content"), EXAMPLES)
def test_whole_text(text: str, thinking: bool, reasoning: str | None, content: str) -> None:
    assert split_reasoning(text, thinking) == (reasoning, content)


@pytest.mark.parametrize(("text", "thinking", "reasoning", "content"), EXAMPLES)
def test_stream_equals_whole_for_every_chunking(
    text: str, thinking: bool, reasoning: str | None, content: str
) -> None:
    expected = (reasoning or "", content)
    for chunks in itertools.chain(_chunkings(text), [list(text)]):
        assert _run_stream(chunks, thinking) == expected, chunks


@pytest.mark.parametrize(("text", "expected"), [("a</think>b", ("a", "b")), ("<think>x</think>", ("x", ""))])
def test_every_chunking_of_short_tagged_texts(text: str, expected: tuple[str, str]) -> None:
    for chunks in _chunkings(text):
        assert _run_stream(chunks, True) == expected, chunks


def test_stream_emits_without_delay_and_holds_only_what_is_ambiguous() -> None:
    parser = ReasoningStreamParser(thinking=True)
    assert parser.feed("<think>\nabc") == ("abc", "")
    assert parser.feed("\n") == ("", "")  # may be the newline before </think>
    assert parser.feed("def <") == ("\ndef ", "")  # "<" may start a tag
    assert parser.feed("x") == ("<x", "")
    assert parser.feed("\n</thi") == ("", "")
    assert parser.in_reasoning
    assert parser.feed("nk>\n\nAns") == ("", "Ans")
    assert not parser.in_reasoning
    assert parser.feed("wer </thi") == ("", "wer </thi")  # content is never held back
    assert parser.finish() == ("", "")


def test_thinking_off_is_all_content() -> None:
    parser = ReasoningStreamParser(thinking=False)
    assert parser.feed("\n<think>") == ("", "\n<think>")
    assert parser.feed("x</think>y") == ("", "x</think>y")
    assert parser.finish() == ("", "")
    assert split_reasoning("\n<think>x</think>y", thinking=False) == (None, "\n<think>x</think>y")


def test_unterminated_thinking_is_all_reasoning() -> None:
    parser = ReasoningStreamParser(thinking=True)
    assert parser.feed("<think>\nI am still thinking\n\n</") == ("I am still thinking", "")
    assert parser.finish() == ("\n\n</", "")  # the newlines were not before a tag after all
    assert split_reasoning("<think>\nI am still thinking\n\n</", True) == ("I am still thinking\n\n</", "")


def test_on_detokenized_qwen3_output(qwen3_tokenizer: Tokenizer) -> None:
    # <think> and </think> are single tokens; split the text at token boundaries, as the engine does.
    text = "<think>\nThe user greets me. 用户在打招呼。\n</think>\n\nHello! 你好！<b>"
    ids = qwen3_tokenizer.encode(text)
    assert qwen3_tokenizer.think_start_id in ids and qwen3_tokenizer.think_end_id in ids
    chunks = [
        qwen3_tokenizer.decode(ids[: i + 1])[len(qwen3_tokenizer.decode(ids[:i])) :] for i in range(len(ids))
    ]
    assert "".join(chunks) == text
    assert _run_stream(chunks, True) == ("The user greets me. 用户在打招呼。", "Hello! 你好！<b>")


@pytest.mark.parametrize("thinking", [True, False])
def test_random_texts_and_chunkings(thinking: bool) -> None:
    pieces = ["<think>", "</think>", "<", "</", "<thi", "</thin", "think", ">", "\n", "\n\n", "a", "中"]
    for seed in range(400):
        rng = random.Random(seed)
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, len(text) - 1))) if len(text) > 1 else []
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        reasoning, content = split_reasoning(text, thinking)
        assert _run_stream(chunks, thinking) == (reasoning or "", content), (seed, chunks)
