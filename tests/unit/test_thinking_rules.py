"""Automatic thinking: the rule set on the labelled prompts, and "auto" in the precedence table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swiftlm.core.generation import ThinkingChoice, resolve_thinking, resolve_thinking_choice
from swiftlm.text.thinking_rules import (
    ThinkingRules,
    ThinkingRulesError,
    last_user_text,
    load_thinking_rules,
)

PROMPTS = Path(__file__).parents[1] / "data" / "thinking_prompts.jsonl"


def labelled() -> list[dict]:
    return [json.loads(line) for line in PROMPTS.read_text(encoding="utf-8").splitlines() if line.strip()]


def accuracy(rules: ThinkingRules, rows: list[dict]) -> tuple[float, list[str]]:
    wrong = [r["text"] for r in rows if rules.decide(r["text"]).thinking != r["thinking"]]
    return 1 - len(wrong) / len(rows), wrong


def test_labelled_set_is_balanced_in_both_halves() -> None:
    rows = labelled()
    assert len(rows) >= 60
    for split in ("fit", "held_out"):
        half = [r for r in rows if r["split"] == split]
        for lang in ("en", "zh"):
            for thinking in (True, False):
                group = [r for r in half if r["lang"] == lang and r["thinking"] is thinking]
                assert len(group) == len(half) // 4, (split, lang, thinking)
    texts = [r["text"] for r in rows]
    assert len(set(texts)) == len(texts), "a prompt appears twice"


def test_default_rules_decide_the_held_out_half() -> None:
    rules = load_thinking_rules()
    rows = labelled()
    fit, fit_wrong = accuracy(rules, [r for r in rows if r["split"] == "fit"])
    held_out, held_out_wrong = accuracy(rules, [r for r in rows if r["split"] == "held_out"])
    print(f"\nthinking rules accuracy: fit {fit:.1%} (wrong: {fit_wrong}), "
          f"held out {held_out:.1%} (wrong: {held_out_wrong})")
    assert held_out >= 0.9, held_out_wrong
    assert fit >= 0.9, fit_wrong


def test_the_reference_deployments_examples() -> None:
    rules = load_thinking_rules()
    assert rules.decide("你好").thinking is False
    assert rules.decide("推导爱因斯坦质能方程").thinking is True


def test_rule_order_and_matching() -> None:
    rules = ThinkingRules(on_words=("prove", "证明"), off_words=("hi", "谢谢"), max_units_off=4, min_numbers_on=2)
    assert rules.decide("prove it").rule == "on_word:prove"  # short, but asks for a proof
    assert rules.decide("hi, please prove that this sum converges").thinking is True  # the ask beats the greeting
    assert rules.decide("what is 12 times 34").rule == "numbers"
    assert rules.decide("ok then").rule == "short"
    assert rules.decide("hi there, lovely weather we are having").rule == "off_word:hi"
    # a Latin entry matches whole words only: "this" holds no "hi"
    assert rules.decide("this thing is rather long, isn't it").rule == "default"
    assert rules.decide("非常谢谢你今天下午的帮助").rule == "off_word:谢谢"  # CJK: anywhere
    assert ThinkingRules(max_units_off=0, default=False).decide("anything at all").thinking is False


def test_rules_file_overrides_the_default(tmp_path: Path) -> None:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"on_words": ["hello"], "max_units_off": 0, "default": "off"}), encoding="utf-8")
    rules = load_thinking_rules(path)
    assert rules.decide("hello").thinking is True
    assert rules.decide("推导爱因斯坦质能方程").thinking is False
    path.write_text(json.dumps({"on_word": ["x"]}), encoding="utf-8")
    with pytest.raises(ThinkingRulesError, match="unknown keys on_word"):
        load_thinking_rules(path)
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ThinkingRulesError, match="not JSON"):
        load_thinking_rules(path)
    with pytest.raises(ThinkingRulesError, match="cannot read"):
        load_thinking_rules(tmp_path / "absent.json")


def test_last_user_text() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "推导"},
                {"role": "assistant", "content": "..."}, {"role": "user", "content": "你好"}]
    assert last_user_text(messages) == "你好"
    assert last_user_text([{"role": "system", "content": "x"}]) == ""


def test_auto_in_the_precedence_table() -> None:
    calls = []

    def decide() -> bool:
        calls.append(1)
        return False

    def choice(**fields) -> ThinkingChoice:
        return resolve_thinking_choice(decide_auto=decide, **fields)

    assert choice(enable_thinking="auto").label == "auto:off"
    assert choice(template_kwargs={"enable_thinking": "auto"}).label == "auto:off"
    assert choice(default_template_kwargs={"enable_thinking": "auto"}).label == "auto:off"
    assert choice(default_thinking="auto").label == "auto:off"
    assert len(calls) == 4
    # a request's explicit choice beats the server's auto; reasoning_effort beats it too
    assert choice(enable_thinking=True, default_thinking="auto").label == "on"
    assert choice(reasoning_effort="high", default_thinking="auto").label == "on"
    assert choice(default_thinking="off").label == "off"
    assert choice().label == "on"  # row 6: Qwen3's default
    assert choice(enable_thinking="auto", can_think=False).label == "off"  # row 0 first
    assert len(calls) == 4
    with pytest.raises(ValueError, match="needs a rule set"):
        resolve_thinking(enable_thinking="auto")
    with pytest.raises(ValueError, match='true, false or "auto"'):
        resolve_thinking_choice(enable_thinking="maybe", decide_auto=decide)
