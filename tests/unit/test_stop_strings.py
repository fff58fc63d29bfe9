"""Stop strings on streamed text."""

from __future__ import annotations

import random

import pytest

from swiftlm.text.stop import StopStringMatcher


def _feed_all(matcher: StopStringMatcher, deltas: list[str]) -> tuple[list[str], bool]:
    out = []
    stopped = False
    for delta in deltas:
        emitted, stopped = matcher.feed(delta)
        out.append(emitted)
        if stopped:
            break
    if not stopped:
        out.append(matcher.flush())
    return out, stopped


def test_stop_spanning_several_deltas() -> None:
    matcher = StopStringMatcher(("STOP",))
    assert matcher.feed("abc ST") == ("abc ", False)
    assert matcher.pending == "ST"
    assert matcher.feed("O") == ("", False)
    assert matcher.feed("P tail") == ("", True)
    assert matcher.stopped and matcher.matched_stop == "STOP"
    assert matcher.feed("more") == ("", True)
    assert matcher.flush() == ""


def test_earliest_occurrence_wins() -> None:
    matcher = StopStringMatcher(("world", "hello"))
    assert matcher.feed("say hello world") == ("say ", True)
    assert matcher.matched_stop == "hello"


def test_first_completed_stop_wins_when_nested() -> None:
    # "bc" completes before "abcd" could, so the stream stops there, however the text is split.
    for deltas in (["abcd"], ["a", "b", "c", "d"], ["ab", "cd"]):
        out, stopped = _feed_all(StopStringMatcher(("abcd", "bc")), deltas)
        assert ("".join(out), stopped) == ("a", True)


def test_overlapping_prefixes() -> None:
    matcher = StopStringMatcher(("aab",))
    assert matcher.feed("a") == ("", False)
    assert matcher.feed("a") == ("", False)
    assert matcher.feed("a") == ("a", False)  # "aaa": only the suffix "aa" can still become "aab"
    assert matcher.feed("b") == ("", True)

    matcher = StopStringMatcher(("abcd", "bce"))
    assert matcher.feed("xabc") == ("x", False)  # "abc" is a prefix of "abcd"
    assert matcher.feed("e") == ("a", True)  # "bce" completes


def test_held_back_text_is_released() -> None:
    matcher = StopStringMatcher(("</answer>",))
    assert matcher.feed("x <") == ("x ", False)
    assert matcher.feed("/a") == ("", False)
    assert matcher.feed("b> y") == ("</ab> y", False)
    assert matcher.feed("</ans") == ("", False)
    assert matcher.flush() == "</ans"  # end of stream without a match


def test_include_stop_str_in_output() -> None:
    matcher = StopStringMatcher(("STOP", "END"), include_stop_str_in_output=True)
    assert matcher.feed("abc ST") == ("abc ", False)
    assert matcher.feed("OP more END") == ("STOP", True)


def test_no_stops_passes_through() -> None:
    matcher = StopStringMatcher(())
    assert matcher.feed("anything <") == ("anything <", False)
    assert matcher.flush() == ""


def test_empty_stop_string_is_rejected() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        StopStringMatcher(("ok", ""))


def _reference(text: str, stops: tuple[str, ...], include: bool) -> tuple[str, bool]:
    """Scan the text one character at a time; stop at the first prefix that contains a stop string."""
    for end in range(1, len(text) + 1):
        hits = [(text.find(s, 0, end), s) for s in stops if text.find(s, 0, end) >= 0]
        if hits:
            start, stop = min(hits)
            return text[: start + len(stop)] if include else text[:start], True
    return text, False


def _longest_held_suffix(text: str, stops: tuple[str, ...]) -> int:
    return max(
        (k for k in range(1, len(text) + 1) for s in stops if len(s) > k and s.startswith(text[-k:])),
        default=0,
    )


@pytest.mark.parametrize("include", [False, True])
def test_random_chunkings_match_reference(include: bool) -> None:
    for seed in range(300):
        rng = random.Random(seed)
        stops = tuple(
            "".join(rng.choice("ab") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))
        )
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 25)))
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, len(text) - 1))) if len(text) > 1 else []
        deltas = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        matcher = StopStringMatcher(stops, include_stop_str_in_output=include)
        seen = ""
        out = []
        stopped = False
        for delta in deltas:
            emitted, stopped = matcher.feed(delta)
            out.append(emitted)
            seen += delta
            if stopped:
                break
            # holds back exactly the longest suffix that could still become a stop string
            assert len(matcher.pending) == _longest_held_suffix(seen, stops), (seed, seen, stops)
            assert "".join(out) + matcher.pending == seen
        if not stopped:
            out.append(matcher.flush())
        assert ("".join(out), stopped) == _reference(text, stops, include), (seed, stops, deltas)
