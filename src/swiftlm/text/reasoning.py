"""Split Qwen3 output into reasoning (`reasoning_content`) and the answer (`content`).

With thinking on, the prompt ends with "<|im_start|>assistant\\n" and the model writes

    <think>\\n{reasoning}\\n</think>\\n\\n{answer}

With thinking off, the prompt already ends with "<think>\\n\\n</think>\\n\\n" and all output is the
answer. The text must be detokenized with the tags kept (they are added, non-special tokens, so
skip_special_tokens=True keeps them too).

Rules with thinking on, read left to right:
- everything before the first "</think>" is reasoning; a "<think>" tag inside it is removed, so
  output that lacks the opening tag (it was in the prompt) still splits at "</think>", as vLLM's
  qwen3 parser does; if "</think>" never comes, everything is reasoning;
- newlines at both ends of the reasoning, and at the start of the answer, are dropped, as Qwen3's
  chat template drops them when it renders the turn back;
- the answer after "</think>" is kept verbatim otherwise.
With thinking off, the text is the answer, verbatim.

`split_reasoning` applies these rules to a whole text, `ReasoningStreamParser` to a stream of
deltas; both give the same result for any split of the text into deltas.
"""

from __future__ import annotations

import re

THINK_START = "<think>"
THINK_END = "</think>"

_TAG_RE = re.compile(re.escape(THINK_END) + "|" + re.escape(THINK_START))
_TAG_PREFIXES = frozenset(tag[:k] for tag in (THINK_START, THINK_END) for k in range(1, len(tag)))


def split_reasoning(text: str, thinking: bool) -> tuple[str | None, str]:
    """(reasoning, content) of a whole output; reasoning is None when there is none."""
    if not thinking:
        return None, text
    reasoning_parts = []
    content = ""
    pos = 0
    for match in _TAG_RE.finditer(text):
        reasoning_parts.append(text[pos : match.start()])
        pos = match.end()
        if match.group() == THINK_END:
            content = text[pos:].lstrip("\n")
            break
    else:
        reasoning_parts.append(text[pos:])
    reasoning = "".join(reasoning_parts).strip("\n")
    return reasoning or None, content


def _partial_tag_length(text: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a think tag."""
    for k in range(min(len(text), len(THINK_END) - 1), 0, -1):
        if text[-k:] in _TAG_PREFIXES:
            return k
    return 0


class ReasoningStreamParser:
    """Streaming form of `split_reasoning`: feed text deltas, get (reasoning_delta, content_delta).

    Holds back what it cannot classify yet: a possible partial tag ("</thi") and, inside the
    reasoning, a run of trailing newlines (they are dropped if "</think>" follows). Nothing of the
    reasoning ever reaches the content, and no tag appears in either.
    """

    def __init__(self, thinking: bool) -> None:
        self._in_reasoning = thinking
        self._buffer = ""  # unclassified reasoning-side text (may hold a partial tag)
        self._held_newlines = ""  # trailing newlines of the reasoning emitted so far
        self._reasoning_started = False
        self._content_started = not thinking

    @property
    def in_reasoning(self) -> bool:
        """True until "</think>" has been seen (always False with thinking off)."""
        return self._in_reasoning

    def feed(self, delta: str) -> tuple[str, str]:
        if not self._in_reasoning:
            return "", self._content(delta)
        text = self._buffer + delta
        reasoning = []
        pos = 0
        for match in _TAG_RE.finditer(text):
            reasoning.append(text[pos : match.start()])
            pos = match.end()
            if match.group() == THINK_END:
                self._buffer = ""
                self._in_reasoning = False
                return self._reasoning("".join(reasoning), final=True), self._content(text[pos:])
        rest = text[pos:]
        hold = _partial_tag_length(rest)
        reasoning.append(rest[: len(rest) - hold])
        self._buffer = rest[len(rest) - hold :] if hold else ""
        return self._reasoning("".join(reasoning), final=False), ""

    def finish(self) -> tuple[str, str]:
        """At the end of the stream: whatever was held back, classified."""
        if not self._in_reasoning:
            return "", ""
        text, self._buffer = self._buffer, ""
        return self._reasoning(text, final=True), ""

    def _reasoning(self, text: str, final: bool) -> str:
        text = self._held_newlines + text
        if not self._reasoning_started:
            text = text.lstrip("\n")
        trimmed = text.rstrip("\n")
        self._held_newlines = "" if final else text[len(trimmed) :]
        if trimmed:
            self._reasoning_started = True
        return trimmed

    def _content(self, text: str) -> str:
        if not self._content_started:
            text = text.lstrip("\n")
            self._content_started = bool(text)
        return text
