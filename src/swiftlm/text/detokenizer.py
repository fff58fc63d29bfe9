"""Incremental detokenization: token ids in, finished text deltas out, at O(window) cost per token.

Byte-level BPE splits one character (a Chinese character, an emoji) across several tokens, so the
text of a prefix of the ids can end in a half character, which decodes to U+FFFD. We keep a small
window of ids and the text of its first part (the "prefix", already emitted):

    ids:    ... | prefix tokens (emitted) | unread tokens |
                ^ window start            ^ read

Each step decodes the window; if the text does not end in U+FFFD, everything past the prefix text
is final and is emitted, and the unread tokens become the next prefix. Decoding the prefix with its
neighbour keeps tokenizers whose pieces depend on context (SentencePiece spaces) correct.

If the text does end in U+FFFD, only that last character can still change: lossy UTF-8 decoding
turns an unfinished sequence at the end into one U+FFFD, and every byte before that sequence is
already decoded for good (an invalid byte stays U+FFFD whatever follows). So the text before it
is emitted at once and only the last character waits: a stream of invalid bytes (a broken or
random model) still streams instead of holding everything back until it finishes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

_REPLACEMENT = "\ufffd"

# Prompt tokens decoded as context in front of the first generated token.
_PROMPT_CONTEXT_TOKENS = 5


class _Decoder(Protocol):
    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of text deltas that never split a character.

    The concatenation of all deltas from `add`/`add_tokens` and `flush` equals
    `tokenizer.decode(generated_ids, skip_special_tokens)`. A delta never ends in U+FFFD caused by
    an incomplete character; invalid bytes that are followed by more text are emitted as U+FFFD,
    exactly as the full decode shows them.
    """

    def __init__(
        self,
        tokenizer: _Decoder,
        prompt_token_ids: Sequence[int] | None = None,
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        context = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:]) if prompt_token_ids else []
        context_text = self._decode(context)
        if context_text.endswith(_REPLACEMENT):
            # The prompt ends inside a character; it cannot serve as a clean prefix.
            context, context_text = [], ""
        self._window = context
        self._read = len(context)
        self._prefix_text = context_text
        self._held_emitted = 0  # characters past the prefix text already emitted from an unfinished window
        self._pieces: list[str] = []

    @property
    def text(self) -> str:
        """All text emitted so far."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    @property
    def num_pending_tokens(self) -> int:
        """Tokens received whose text is held back (an unfinished character)."""
        return len(self._window) - self._read

    def add(self, token_id: int) -> str:
        """Append one token; return the text it finalises (often "", never half a character)."""
        self._window.append(token_id)
        return self._advance(final=False)

    def add_tokens(self, token_ids: Iterable[int]) -> str:
        """Append several tokens; return the text they finalise."""
        self._window.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of the stream: return the held-back text, whatever the bytes decode to."""
        return self._advance(final=True)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens) if ids else ""

    def _advance(self, final: bool) -> str:
        if self._read == len(self._window):
            return ""
        text = self._decode(self._window)
        start = len(self._prefix_text) + self._held_emitted
        if not final and text.endswith(_REPLACEMENT):
            delta = text[start:-1]  # all but the last character, which may still complete
            self._held_emitted += len(delta)
            if delta:
                self._pieces.append(delta)
            return delta
        delta = text[start:]
        self._held_emitted = 0
        if final:
            # Whatever the last bytes were, the stream restarts clean if more tokens ever come.
            self._window, self._read, self._prefix_text = [], 0, ""
        else:
            del self._window[: self._read]
            self._read = len(self._window)
            self._prefix_text = self._decode(self._window)
        if delta:
            self._pieces.append(delta)
        return delta
