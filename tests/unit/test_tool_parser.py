"""The hermes tool-call parser on scripted outputs, whole and streamed, after the reasoning split.

Streamed results are checked against the whole-text results for every split of the text into
two deltas (so every tag is cut at every boundary) and for one-character deltas.
"""

from __future__ import annotations

import json
import re

import pytest

from swiftlm.text.reasoning import ReasoningStreamParser, split_reasoning
from swiftlm.text.tools import ToolCallStreamParser, ToolDelta, parse_tool_calls

WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'
WEATHER_CALL = ("get_weather", {"city": "Zürich", "days": 2})
TIME_CALL = ("get_time", {"tz": "CET"})


def whole(text: str, thinking: bool, parallel: bool = True) -> tuple[str | None, str | None, list[tuple], int]:
    """(reasoning, content, [(name, arguments)], errors) of a whole output."""
    reasoning, content = split_reasoning(text, thinking)
    parsed = parse_tool_calls(content, parallel)
    calls = [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]
    return reasoning, parsed.content, calls, parsed.errors


def streamed(deltas: list[str], thinking: bool, parallel: bool = True) -> tuple[str | None, str | None, list[tuple], int]:
    """The same, through the two stream parsers; checks OpenAI's delta shape on the way."""
    reasoning_parser, tool_parser = ReasoningStreamParser(thinking), ToolCallStreamParser(parallel)
    reasoning, items = "", []
    for delta in deltas:
        r, c = reasoning_parser.feed(delta)
        reasoning += r
        items += tool_parser.feed(c)
    r, c = reasoning_parser.finish()
    reasoning += r
    items += tool_parser.feed(c) + tool_parser.finish()
    return reasoning or None, _content(items), _calls(items, tool_parser), tool_parser.errors


def _content(items: list[ToolDelta]) -> str | None:
    assert all(item.content for item in items if item.index is None), "no empty content delta"
    return "".join(item.content for item in items if item.index is None) or None


def _calls(items: list[ToolDelta], parser: ToolCallStreamParser) -> list[tuple]:
    pieces = [item for item in items if item.index is not None]
    calls = []
    for index, call in enumerate(parser.tool_calls):
        mine = [p for p in pieces if p.index == index]
        first, rest = mine[0], mine[1:]
        assert (first.id, first.name, first.arguments) == (call.id, call.name, "")  # OpenAI's first delta
        assert all(p.id is None and p.name is None for p in rest)
        arguments = "".join(p.arguments or "" for p in rest)
        assert arguments == call.arguments
        calls.append((call.name, json.loads(arguments)))
    assert [p.index for p in pieces] == sorted(p.index for p in pieces)  # calls in order, never interleaved
    return calls


def all_splits(text: str) -> list[list[str]]:
    return [[text[:k], text[k:]] for k in range(len(text) + 1)] + [list(text)]


CASES = [
    # (name, output, thinking, parallel, expected (reasoning, content, calls, errors))
    ("one call", WEATHER, False, True, (None, None, [WEATHER_CALL], 0)),
    ("two calls", WEATHER + "\n" + TIME, False, True, (None, None, [WEATHER_CALL, TIME_CALL], 0)),
    ("two calls, parallel off", WEATHER + "\n" + TIME, False, False, (None, None, [WEATHER_CALL], 0)),
    ("text then a call", "Let me check the weather.\n\n" + WEATHER, False, True,
     (None, "Let me check the weather.", [WEATHER_CALL], 0)),
    ("a call then text", WEATHER + "\n\nDone <tool", False, True, (None, "Done <tool", [WEATHER_CALL], 0)),
    ("thinking, then a call", "<think>\nI should look it up.\n</think>\n\n" + WEATHER, True, True,
     ("I should look it up.", None, [WEATHER_CALL], 0)),
    ("a call inside the think block stays reasoning", f"<think>\nMaybe {TIME}\n</think>\n\nIt is sunny.", True, True,
     (f"Maybe {TIME}", "It is sunny.", [], 0)),
    ("a call inside the think block and one after it", f"<think>\n{TIME}\n</think>\n\n{WEATHER}", True, True,
     (TIME, None, [WEATHER_CALL], 0)),
    ("thinking off: think-like text is content", "Plain answer, no tags.", False, True,
     (None, "Plain answer, no tags.", [], 0)),
    ("malformed JSON is content", "Hi <tool_call>\n{\"name\": \"get_time\", \"arguments\": {\n</tool_call> bye", False, True,
     (None, "Hi <tool_call>\n{\"name\": \"get_time\", \"arguments\": {\n</tool_call> bye", [], 1)),
    ("a call without a name is content", '<tool_call>\n{"arguments": {}}\n</tool_call>', False, True,
     (None, '<tool_call>\n{"arguments": {}}\n</tool_call>', [], 1)),
    ("arguments that are not an object are content", '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', False,
     True, (None, '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', [], 1)),
    ("a malformed call beside a good one", "<tool_call>oops</tool_call>\n" + TIME, False, True,
     (None, "<tool_call>oops</tool_call>", [TIME_CALL], 1)),
    ("a call that never closes is content, not an error", "Sure.\n<tool_call>\n{\"name\": \"get_t", False, True,
     (None, "Sure.\n<tool_call>\n{\"name\": \"get_t", [], 0)),
    ("missing arguments mean {}", '<tool_call>{"name": "ping"}</tool_call>', False, True, (None, None, [("ping", {})], 0)),
    ("a partial tag at the end is content", "The tag is <tool_ca", False, True, (None, "The tag is <tool_ca", [], 0)),
]


@pytest.mark.parametrize(("name", "output", "thinking", "parallel", "expected"), CASES, ids=[c[0] for c in CASES])
def test_whole_output(name: str, output: str, thinking: bool, parallel: bool, expected: tuple) -> None:
    assert whole(output, thinking, parallel) == expected


@pytest.mark.parametrize(("name", "output", "thinking", "parallel", "expected"), CASES, ids=[c[0] for c in CASES])
def test_every_split_streams_the_whole_result(name: str, output: str, thinking: bool, parallel: bool, expected: tuple) -> None:
    for deltas in all_splits(output):
        assert streamed(deltas, thinking, parallel) == expected, deltas


def test_think_end_and_tool_call_tags_split_at_every_pair_of_boundaries() -> None:
    """Both tags cut at once, each at every point inside it (three deltas)."""
    output = "<think>\nplan</think>\n\nOK." + WEATHER
    expected = ("plan", "OK.", [WEATHER_CALL], 0)
    end = output.index("</think>")
    start = output.index("<tool_call>")
    for a in range(end, end + len("</think>") + 1):
        for b in range(start, start + len("<tool_call>") + 1):
            assert streamed([output[:a], output[a:b], output[b:]], True) == expected, (a, b)


def test_ids_are_call_and_random_hex() -> None:
    calls = parse_tool_calls(WEATHER + TIME).tool_calls
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", c.id) for c in calls)
    assert len({c.id for c in calls}) == 2
    assert calls[0].to_openai() == {
        "id": calls[0].id, "type": "function", "function": {"name": "get_weather", "arguments": calls[0].arguments}
    }
    assert "Zürich" in calls[0].arguments  # non-ASCII kept as written


def test_content_before_a_call_streams_before_it_closes() -> None:
    parser = ToolCallStreamParser()
    assert parser.feed("Checking") == [ToolDelta(content="Checking")]
    assert parser.feed(" now.\n<tool_call>\n{\"name\": \"get_time\"") == [ToolDelta(content=" now.")]
    assert parser.feed(', "arguments": {}}\n</tool_call>')[0].name == "get_time"
