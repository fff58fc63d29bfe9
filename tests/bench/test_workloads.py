from __future__ import annotations

import pytest

from swiftlm.bench import workloads as wl
from swiftlm.bench.workloads import PRESETS, WORKLOAD_NAMES, WorkloadOptions, build_workload

SIZES = {"summary": 6, "shared-prefix": 10, "random": 8}


def _size(name: str) -> int:
    return SIZES.get(name, 16)


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_same_seed_same_workload(name: str) -> None:
    a = build_workload(name, _size(name), seed=7)
    assert a == build_workload(name, _size(name), seed=7)
    assert a != build_workload(name, _size(name), seed=8)
    assert len(a) == _size(name)


def _in_range(n: int, lo: int, hi: int, slack: int = 4) -> bool:
    return lo - slack <= n <= hi


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_token_counts_in_range(name: str, count_tokens) -> None:
    requests = build_workload(name, _size(name), seed=3, count_tokens=count_tokens)
    for r in requests:
        texts = [c for _, c in r.messages] if r.kind == "chat" else [r.prompt]
        assert r.input_tokens == sum(count_tokens(t) for t in texts)
        user = count_tokens(texts[-1])
        if name == "qa":
            assert _in_range(user, *wl.QA_INPUT_TOKENS)
        elif name == "summary":
            assert _in_range(user, *wl.SUMMARY_INPUT_TOKENS)
        elif name == "code":
            assert _in_range(user, *wl.CODE_INPUT_TOKENS)
        elif name == "chat":
            assert _in_range(user, *wl.CHAT_TURN_TOKENS)
            if r.turn == 0:
                assert _in_range(count_tokens(texts[0]), *wl.CHAT_SYSTEM_TOKENS)
        elif name == "shared-prefix":
            assert _in_range(user, *wl.SHARED_PREFIX_QUESTION_TOKENS)
            assert 990 <= count_tokens(texts[0]) <= 1000
        else:
            assert user == 256 and r.max_tokens == 128


def test_mixes_chinese_and_english(count_tokens) -> None:
    texts = [r.messages[-1][1] for r in build_workload("qa", 40, seed=1, count_tokens=count_tokens)]
    chinese = [t for t in texts if any("\u4e00" <= ch <= "\u9fff" for ch in t)]
    assert 0 < len(chinese) < len(texts)


def test_shared_prefix_shares_one_system_prompt() -> None:
    requests = build_workload("shared-prefix", 12, seed=0, options=WorkloadOptions(prefix_len=300))
    assert len({r.messages[0] for r in requests}) == 1
    assert len({r.messages[1] for r in requests}) > 6


def test_chat_conversations_are_ordered_turns_with_sessions() -> None:
    requests = build_workload("chat", 10, seed=2, options=WorkloadOptions(turns=4), session_prefix="t")
    assert [(r.conversation_id, r.turn) for r in requests] == [(c, t) for c in range(3) for t in range(4)][
        :10
    ]
    for r in requests:
        assert r.session_id == f"t-2-{r.conversation_id}"
        roles = [role for role, _ in r.messages]
        assert roles == (["system", "user"] if r.turn == 0 else ["user"])
        assert r.sampling == {"temperature": 0.5} and r.max_tokens == 128


def test_random_lengths_exact_and_ranged(count_tokens) -> None:
    fixed = build_workload(
        "random", 5, seed=0, count_tokens=count_tokens, options=WorkloadOptions(input_len=100, output_len=33)
    )
    assert all(r.kind == "completion" and count_tokens(r.prompt) == 100 for r in fixed)
    assert all(r.max_tokens == 33 and r.sampling == {"ignore_eos": True} for r in fixed)
    ranged = build_workload(
        "random",
        20,
        seed=0,
        count_tokens=count_tokens,
        options=WorkloadOptions(input_len=100, output_len=40, range_ratio=0.5, ignore_eos=False),
    )
    lengths = [count_tokens(r.prompt) for r in ranged]
    assert min(lengths) >= 50 and max(lengths) <= 150 and len(set(lengths)) > 5
    assert all(20 <= r.max_tokens <= 60 and "ignore_eos" not in r.sampling for r in ranged)


def test_presets_match_reference_settings() -> None:
    assert PRESETS["qa"].sampling() == {"temperature": 0.2, "top_p": 0.75} and PRESETS["qa"].max_tokens == 64
    assert PRESETS["content"].sampling() == {"temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.15}
    assert PRESETS["content"].max_tokens == 256
    assert PRESETS["chat"].sampling() == {"temperature": 0.5} and PRESETS["chat"].max_tokens == 128
    summary = build_workload("summary", 1)[0]
    assert summary.max_tokens == 128 and summary.sampling["repetition_penalty"] == 1.15
    assert build_workload("code", 1)[0].max_tokens == 256
    qa_as_content = build_workload("qa", 1, options=WorkloadOptions(preset="content"))[0]
    assert qa_as_content.max_tokens == 256 and qa_as_content.sampling["temperature"] == 0.6
    assert build_workload("qa", 1, options=WorkloadOptions(max_tokens=7))[0].max_tokens == 7


def test_bad_arguments_say_what_to_change() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        build_workload("nope", 1)
    with pytest.raises(ValueError, match="unknown preset"):
        WorkloadOptions(preset="fast")
