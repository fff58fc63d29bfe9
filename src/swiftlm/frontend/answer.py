"""A chat answer's parts: the text the output processor made, split into reasoning, content and
tool calls. One place for every caller that reads a chat answer: the chat route (whole and
streamed, and the Responses API through it), ``LLM.record_turn`` and the CLI's chat.

``separate``: the reasoning is split from the answer (thinking on and a reasoning parser);
otherwise it stays inline, as the model wrote it. ``parse_tools``: tool calls are read from the
content (``swiftlm.server.completions.tool_choice`` decides when); ``parallel``: more than one may be made.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swiftlm.text.reasoning import ReasoningStreamParser, split_reasoning
from swiftlm.text.tools import ToolCall, ToolCallStreamParser, ToolDelta, parse_tool_calls


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole answer: ``content`` is None when tool calls were all it said."""

    reasoning: str | None
    content: str | None
    tool_calls: list[dict] = field(default_factory=list)  # OpenAI's form
    errors: int = 0  # calls that did not parse (left in the content)


def read_answer(text: str, separate: bool, parse_tools: bool = False, parallel: bool = True) -> Answer:
    """Split a whole answer's text."""
    reasoning, content = split_reasoning(text, separate)
    if not parse_tools:
        return Answer(reasoning, content)
    parsed = parse_tool_calls(content, parallel)
    return Answer(reasoning, parsed.content, [call.to_openai() for call in parsed.tool_calls], parsed.errors)


class AnswerStream:
    """One sequence's answer as its text streams: ``feed`` each text delta; it returns the reasoning
    it finalises and the content and tool-call pieces (``ToolDelta``: content when ``index`` is None)."""

    def __init__(self, separate: bool, parse_tools: bool = False, parallel: bool = True) -> None:
        self._reasoning = ReasoningStreamParser(separate)
        self._tools = ToolCallStreamParser(parallel) if parse_tools else None
        self.content = ""  # the content so far, tool calls left out

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self._tools.tool_calls if self._tools is not None else []

    @property
    def errors(self) -> int:
        """Tool calls that did not parse (sent as content)."""
        return self._tools.errors if self._tools is not None else 0

    def feed(self, text: str, finished: bool = False) -> tuple[str, list[ToolDelta]]:
        reasoning, content = self._reasoning.feed(text)
        if finished:
            tail_reasoning, tail_content = self._reasoning.finish()
            reasoning, content = reasoning + tail_reasoning, content + tail_content
        if self._tools is None:
            items = [ToolDelta(content=content)] if content else []
        else:
            items = self._tools.feed(content)
            if finished:
                items += self._tools.finish()
        self.content += "".join(item.content for item in items if item.index is None)
        return reasoning, items
