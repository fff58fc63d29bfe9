"""Automatic thinking: whether a question needs the model to think, decided by rules over the
user's last message.

The rules are data (``ThinkingRules``, read from a JSON file: the default one ships beside this
module, ``--thinking-rules PATH`` replaces it). They follow the reference deployment's rule
(inputs under 10 characters, and greetings, go without thinking), with two changes that keep a
real question from losing its reasoning: a message that asks to derive, prove, compute, solve,
plan, design or explain why thinks even when it is short or starts with a greeting, and so does
a word problem (``min_numbers_on`` numbers or more). The rules, in order, first match wins:

1. an ``on_words`` entry occurs in the message -> on ("prove", "推导", "为什么", ...)
2. the message holds at least ``min_numbers_on`` numbers -> on (a word problem)
3. the message is shorter than ``max_units_off`` units -> off; a unit is one CJK character or
   one Latin word (the reference counts characters of Chinese text; a word is the English
   counterpart: "Hello there!" is 2 units, "你好" is 2)
4. an ``off_words`` entry occurs (greetings, thanks, small talk, jokes, translation) -> off
5. ``default`` (on: Qwen3's own default)

Matching ignores case; an entry made of Latin letters matches whole words only ("hi" does not
match "this"), any other entry matches anywhere (Chinese has no spaces).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

DEFAULT_RULES_FILE = "thinking_rules.json"  # beside this module
_UNIT = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]|[A-Za-z0-9]+(?:['’][A-Za-z]+)?")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


class ThinkingRulesError(ValueError):
    """A rules file that cannot be read, with what to change."""


@dataclass(frozen=True, slots=True)
class ThinkingDecision:
    """``thinking`` on or off, and the rule that decided (``on_word:prove``, ``short``, ...)."""

    thinking: bool
    rule: str


@dataclass(frozen=True, slots=True)
class ThinkingRules:
    on_words: tuple[str, ...] = ()
    off_words: tuple[str, ...] = ()
    max_units_off: int = 10
    min_numbers_on: int = 2
    default: bool = True

    def __post_init__(self) -> None:
        for name in ("on_words", "off_words"):
            words = tuple(getattr(self, name))
            if not all(isinstance(w, str) and w.strip() for w in words):
                raise ThinkingRulesError(f"{name} must be a list of non-empty strings")
            object.__setattr__(self, name, tuple(w.strip().lower() for w in words))
        if self.max_units_off < 0 or self.min_numbers_on < 1:
            raise ThinkingRulesError("max_units_off must be >= 0 and min_numbers_on >= 1")

    def decide(self, text: str) -> ThinkingDecision:
        """The decision for one user message (the rules are in the module docstring)."""
        lowered = text.strip().lower()
        word = _first_match(lowered, self.on_words)
        if word is not None:
            return ThinkingDecision(True, f"on_word:{word}")
        if len(_NUMBER.findall(lowered)) >= self.min_numbers_on:
            return ThinkingDecision(True, "numbers")
        if len(_UNIT.findall(lowered)) < self.max_units_off:
            return ThinkingDecision(False, "short")
        word = _first_match(lowered, self.off_words)
        if word is not None:
            return ThinkingDecision(False, f"off_word:{word}")
        return ThinkingDecision(self.default, "default")


def _first_match(text: str, words: tuple[str, ...]) -> str | None:
    for word in words:
        if word.isascii() and re.fullmatch(r"[a-z0-9' ]+", word):
            if re.search(rf"(?<![a-z0-9]){re.escape(word)}(?![a-z0-9])", text):
                return word
        elif word in text:
            return word
    return None


def rules_from_dict(data: dict[str, Any], where: str = "the rules") -> ThinkingRules:
    known = {"on_words", "off_words", "max_units_off", "min_numbers_on", "default", "comment"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ThinkingRulesError(f"{where}: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    default = data.get("default", "on")
    if default not in ("on", "off"):
        raise ThinkingRulesError(f'{where}: default must be "on" or "off", got {default!r}')
    try:
        return ThinkingRules(
            on_words=tuple(data.get("on_words", ())), off_words=tuple(data.get("off_words", ())),
            max_units_off=int(data.get("max_units_off", 10)), min_numbers_on=int(data.get("min_numbers_on", 2)),
            default=default == "on",
        )
    except (TypeError, ValueError) as exc:
        raise ThinkingRulesError(f"{where}: {exc}") from exc


def load_thinking_rules(path: str | Path | None = None) -> ThinkingRules:
    """The rules in ``path`` (a JSON object), or the default rules shipped with swiftlm."""
    if path is None:
        text = resources.files("swiftlm.text").joinpath(DEFAULT_RULES_FILE).read_text(encoding="utf-8")
        where = "the default thinking rules"
    else:
        where = f"thinking rules file {path}"
        try:
            text = Path(path).expanduser().read_text(encoding="utf-8")
        except OSError as exc:
            raise ThinkingRulesError(f"{where}: cannot read it ({exc.strerror})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ThinkingRulesError(f"{where} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ThinkingRulesError(f"{where} must hold a JSON object")
    return rules_from_dict(data, where)


def last_user_text(messages: list[dict[str, Any]]) -> str:
    """The text of the last user message ("" when there is none): what the rules read."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return str(message.get("content") or "")
    return ""
