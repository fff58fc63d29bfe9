"""Stop strings on streamed text: emit only what can no longer become part of a stop string."""

from __future__ import annotations


class StopStringMatcher:
    """Watches detokenized text for stop strings.

    While no stop string has matched, `feed` holds back exactly the longest suffix of the text that
    is a proper prefix of some stop string, and emits everything before it. The stream stops as
    soon as a stop string is complete; if several complete in the same delta, the one that
    completes first wins, and among those the one that starts first. The emitted text ends right
    before the stop string (or right after it with include_stop_str_in_output). Because the
    decision is taken at the first character that completes a stop string, the result does not
    depend on how the text was split into deltas.
    """

    def __init__(self, stops: tuple[str, ...] | list[str], include_stop_str_in_output: bool = False) -> None:
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self._stops = tuple(dict.fromkeys(stops))
        self._include = include_stop_str_in_output
        self._prefixes = frozenset(s[:k] for s in self._stops for k in range(1, len(s)))
        self._max_prefix = max((len(s) - 1 for s in self._stops), default=0)
        self._pending = ""
        self._matched: str | None = None

    @property
    def stopped(self) -> bool:
        return self._matched is not None

    @property
    def matched_stop(self) -> str | None:
        """The stop string that ended the stream, or None."""
        return self._matched

    @property
    def pending(self) -> str:
        """Text held back because it could still start a stop string."""
        return self._pending

    def feed(self, delta: str) -> tuple[str, bool]:
        """Add newly detokenized text; return (text safe to emit now, whether a stop string matched).

        After a match, further calls return ("", True).
        """
        if self._matched is not None:
            return "", True
        if not self._stops:
            return delta, False
        text = self._pending + delta
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self._stops:
            start = text.find(stop)
            if start >= 0:
                candidate = (start + len(stop), start, stop)
                if best is None or candidate[:2] < best[:2]:
                    best = candidate
        if best is not None:
            end, start, stop = best
            self._matched, self._pending = stop, ""
            return text[: end if self._include else start], True
        hold = self._held_suffix_length(text)
        self._pending = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold], False

    def flush(self) -> str:
        """At the end of the stream (no stop matched): the held-back text."""
        out, self._pending = self._pending, ""
        return out

    def _held_suffix_length(self, text: str) -> int:
        for k in range(min(len(text), self._max_prefix), 0, -1):
            if text[-k:] in self._prefixes:
                return k
        return 0
