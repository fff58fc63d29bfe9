"""Parse Qwen3's hermes tool calls out of the answer, whole and streamed.

Qwen3 writes each call as

    <tool_call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}\\n</tool_call>

one or several in a turn, possibly after some text. The parser reads the *answer* only: the
reasoning has been split off before (``swiftlm.text.reasoning``), so a ``<tool_call>`` written
inside the think block stays reasoning.

Rules, read left to right:
- a call is the text between ``<tool_call>`` and the next ``</tool_call>``; it is well formed when
  that text is a JSON object with a string ``name`` and an object ``arguments`` (absent: ``{}``).
  Its ``arguments`` become a JSON string (``json.dumps``, non-ASCII kept), its id ``call_`` + 24
  random hex digits;
- a malformed call (not JSON, or not of that shape) stays in the content verbatim, tags
  included, and is counted in ``errors``; a ``<tool_call>`` that never closes stays in the
  content too (an answer cut by ``max_tokens``) and is not counted;
- with ``parallel`` False only the first well-formed call is kept; later ones are dropped;
- the content is the text outside the well-formed calls, without the whitespace that touches a
  call; it is None when nothing else is left.

Streaming (``ToolCallStreamParser``): ``feed`` takes content deltas and returns ``ToolDelta``
items in order. Text that could still be the start of ``<tool_call>`` (split across any delta
boundary) and trailing whitespace are held back until they can be classified. A call is emitted
when it closes, as two items: the first with ``id``, ``name`` and empty ``arguments``
(OpenAI's first delta), the second with the whole arguments JSON in one fragment. So a
malformed call is known before anything of it is sent. ``parse_tool_calls`` is this parser fed
the whole text at once, so both give the same result for any split of the text into deltas.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


def new_tool_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text

    def to_openai(self) -> dict:
        """The call as OpenAI's ``tool_calls`` entry (and the chat template's assistant message)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class ToolDelta:
    """One streamed item: content text (``index`` None), or a piece of call ``index``: its first
    piece carries ``id`` and ``name`` (and ``arguments`` ""), the next the arguments."""

    content: str = ""
    index: int | None = None
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


@dataclass(slots=True)
class ParsedAnswer:
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: int = 0  # malformed calls returned as content


def _parse_call(body: str) -> tuple[str, str] | None:
    """(name, arguments JSON) of a call's text, or None when it is malformed."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    return value["name"], json.dumps(arguments, ensure_ascii=False)


def _partial_start_length(text: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``<tool_call>``."""
    for k in range(min(len(text), len(TOOL_CALL_START) - 1), 0, -1):
        if TOOL_CALL_START.startswith(text[-k:]):
            return k
    return 0


class ToolCallStreamParser:
    """Feed answer deltas, get ``ToolDelta`` items (see the module docstring)."""

    def __init__(self, parallel: bool = True) -> None:
        self.parallel = parallel
        self.tool_calls: list[ToolCall] = []
        self.errors = 0
        self._held = ""  # outside a call: trailing whitespace and a possible partial start tag
        self._in_call = False
        self._call_text = ""  # inside a call: what follows <tool_call> so far
        self._gap = ""  # the whitespace before the open call (content again if the call is malformed)
        self._after_call = False  # whitespace right after a well-formed call is dropped

    def feed(self, delta: str) -> list[ToolDelta]:
        out: list[ToolDelta] = []
        text = delta
        while text:
            if self._in_call:
                text = self._feed_call(text, out)
            else:
                text = self._feed_text(text, out)
        return out

    def finish(self) -> list[ToolDelta]:
        """At the end of the answer: what was held back, as content."""
        out: list[ToolDelta] = []
        if self._in_call:  # never closed
            self._content(self._gap + TOOL_CALL_START + self._call_text, out)
            self._in_call, self._call_text, self._gap = False, "", ""
        else:
            self._content(self._held, out)
        self._held = ""
        return out

    def _feed_text(self, text: str, out: list[ToolDelta]) -> str:
        text = self._held + text
        self._held = ""
        at = text.find(TOOL_CALL_START)
        if at >= 0:
            before = text[:at]
            kept = before.rstrip()
            self._content(kept, out)
            self._gap = before[len(kept) :]
            self._in_call = True
            return text[at + len(TOOL_CALL_START) :]
        partial = _partial_start_length(text)
        rest = text[: len(text) - partial]
        kept = rest.rstrip()
        self._content(kept, out)
        self._held = text[len(kept) :]
        return ""

    def _feed_call(self, text: str, out: list[ToolDelta]) -> str:
        self._call_text += text
        at = self._call_text.find(TOOL_CALL_END)
        if at < 0:
            return ""
        body, rest = self._call_text[:at], self._call_text[at + len(TOOL_CALL_END) :]
        self._in_call, self._call_text = False, ""
        parsed = _parse_call(body)
        if parsed is None:
            self.errors += 1
            self._content(self._gap + TOOL_CALL_START + body + TOOL_CALL_END, out)
        elif self.parallel or not self.tool_calls:
            call = ToolCall(new_tool_call_id(), *parsed)
            index = len(self.tool_calls)
            self.tool_calls.append(call)
            out.append(ToolDelta(index=index, id=call.id, name=call.name, arguments=""))
            out.append(ToolDelta(index=index, arguments=call.arguments))
            self._after_call = True
        else:
            self._after_call = True  # a second call with parallel calls off: dropped
        self._gap = ""
        return rest

    def _content(self, text: str, out: list[ToolDelta]) -> None:
        if self._after_call:
            text = text.lstrip()
        if not text:
            return
        self._after_call = False
        if out and out[-1].index is None:
            out[-1] = ToolDelta(content=out[-1].content + text)
        else:
            out.append(ToolDelta(content=text))


def parse_tool_calls(text: str, parallel: bool = True) -> ParsedAnswer:
    """The whole answer's content and calls (the rules in the module docstring)."""
    parser = ToolCallStreamParser(parallel)
    items = parser.feed(text) + parser.finish()
    content = "".join(item.content for item in items if item.index is None)
    return ParsedAnswer(content or None, parser.tool_calls, parser.errors)
