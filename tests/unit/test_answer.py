"""A chat answer read whole and read as it streams, in any split, gives the same parts."""

from __future__ import annotations

import random

import pytest

from swiftlm.frontend.answer import AnswerStream, read_answer

TEXTS = [
    "<think>\nlet me see</think>\n\nHello there!",
    "Hmm</think>\n\nThe answer is <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>",
    "plain words, no tags at all",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>\nnot json\n</tool_call>",
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("separate", [True, False])
@pytest.mark.parametrize("parse_tools", [True, False])
def test_streamed_parts_equal_the_whole_answer(text: str, separate: bool, parse_tools: bool) -> None:
    whole = read_answer(text, separate, parse_tools)
    rng = random.Random(len(text))
    for _ in range(5):
        cuts = sorted(rng.sample(range(1, len(text)), 4))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        stream = AnswerStream(separate, parse_tools)
        reasoning = ""
        for k, piece in enumerate(pieces):
            r, _items = stream.feed(piece, finished=k == len(pieces) - 1)
            reasoning += r
        assert (reasoning or None) == (whole.reasoning or None)
        assert (stream.content or None) == (whole.content or None)
        assert [c.to_openai()["function"] for c in stream.tool_calls] == [c["function"] for c in whole.tool_calls]
        assert stream.errors == whole.errors
