"""Stop conditions, finish reasons and the thinking budget, end to end through the engine.

Uses the scripted checkpoint (tests/conftest.py): a thinking prompt is answered
"<think>Hmm, okay</think>\\n\\nHello there!" then <|im_end|>.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from swiftlm import LLM, SamplingParams
from tests.conftest import ANSWER

MESSAGES = [{"role": "user", "content": "hi"}]
FULL = "<think>Hmm, okay</think>\n\n" + ANSWER


@pytest.fixture(scope="module")
def llm(scripted_model_dir: Path) -> LLM:
    return LLM(str(scripted_model_dir), dtype="float32", max_model_len=64)


def chat(llm: LLM, thinking: bool = True, **params) -> object:
    sp = SamplingParams(temperature=0.0, max_tokens=params.pop("max_tokens", 30), **params)
    return llm.chat(MESSAGES, sp, {"enable_thinking": thinking}).outputs[0]


def test_eos_stops_with_its_token_as_reason(llm: LLM) -> None:
    out = chat(llm)
    assert out.text == FULL
    assert (out.finish_reason, out.stop_reason) == ("stop", 151645)
    assert out.token_ids[-1] == 151645  # the EOS is returned as a token but not as text


def test_stop_string_cuts_the_text(llm: LLM) -> None:
    out = chat(llm, stop=[" there", "never"])
    assert out.text == "<think>Hmm, okay</think>\n\nHello"
    assert (out.finish_reason, out.stop_reason) == ("stop", " there")
    kept = chat(llm, stop=[" there"], include_stop_str_in_output=True)
    assert kept.text == "<think>Hmm, okay</think>\n\nHello there"


def test_stop_string_spanning_tokens(llm: LLM) -> None:
    out = chat(llm, stop=["lo th"])  # "Hello" + " there"
    assert out.text.endswith("Hel")
    assert out.finish_reason == "stop"


def test_streaming_holds_back_only_what_could_become_a_stop_string(llm: LLM) -> None:
    prompt = llm.chat_prompt(MESSAGES, {"enable_thinking": False})
    params = SamplingParams(temperature=0.0, max_tokens=30, stop=["there!"])
    deltas = [out.outputs[0].text for out in llm.stream(prompt, params)]
    assert "".join(deltas) == "Hello "
    assert all("there" not in d for d in deltas)
    assert deltas[0] == "Hello"  # emitted at once: "Hello" cannot start "there!"


def test_stop_token_ids(llm: LLM) -> None:
    out = chat(llm, stop_token_ids=[1052])  # " there"
    assert out.text == "<think>Hmm, okay</think>\n\nHello"
    assert (out.finish_reason, out.stop_reason) == ("stop", 1052)


def test_max_tokens_is_length(llm: LLM) -> None:
    out = chat(llm, max_tokens=3)
    assert out.text == "<think>Hmm,"
    assert out.finish_reason == "length"


def test_min_tokens_bans_eos_until_reached(llm: LLM) -> None:
    out = chat(llm, thinking=False, min_tokens=6, max_tokens=6)
    assert 151645 not in out.token_ids[:5]
    assert len(out.token_ids) == 6


def test_ignore_eos_runs_to_max_tokens(llm: LLM) -> None:
    out = chat(llm, thinking=False, ignore_eos=True, max_tokens=8)
    assert len(out.token_ids) == 8 and out.finish_reason == "length"


def test_context_limit_is_length(llm: LLM) -> None:
    prompt = llm.chat_prompt(MESSAGES, {"enable_thinking": False})
    room = 64 - len(prompt["prompt_token_ids"])
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == room and out.finish_reason == "length"


@pytest.mark.parametrize("budget,reasoning", [(0, "<think>\n\n</think>\n\n"), (2, "<think>Hmm</think>\n\n"),
                                              (4, "<think>Hmm, okay</think>\n\n"), (10, "<think>Hmm, okay</think>\n\n")])
def test_thinking_budget(llm: LLM, budget: int, reasoning: str) -> None:
    out = chat(llm, thinking_budget=budget)
    assert out.text == reasoning + ANSWER
    closed = out.token_ids.index(151668)  # </think>
    assert closed <= max(budget, 2)


def test_generate_detokenises_once_at_the_end_as_streaming_does(tiny_untied_dir: Path) -> None:
    """generate() reports each request once, at its end, and decodes its tokens then (no stop strings
    to match): its text equals the concatenated stream deltas and the tokenizer's own decode, for a
    random model whose tokens split characters and spell invalid UTF-8; with n = 2 each sequence on
    its own; an aborted (length-capped) and a stop-string request alike."""
    tiny = LLM(str(tiny_untied_dir), dtype="float32", max_model_len=128)
    prompts = [[9, 8, 7, 6], list(range(1000, 1020))]
    for params in (SamplingParams(temperature=1.0, seed=3, max_tokens=40, ignore_eos=True, n=2),
                   SamplingParams(temperature=0.0, max_tokens=25, ignore_eos=True)):
        for out in tiny.generate([{"prompt_token_ids": p} for p in prompts], params):
            assert len(out.outputs) == params.n
            for seq in out.outputs:
                assert seq.text == tiny.tokenizer.decode(seq.token_ids)
        streamed = [""] * params.n
        for delta in tiny.stream({"prompt_token_ids": prompts[1]}, params):
            for seq in delta.outputs:
                streamed[seq.index] += seq.text
        assert streamed == [seq.text for seq in tiny.generate([{"prompt_token_ids": prompts[1]}], params)[0].outputs]
    cut = SamplingParams(temperature=0.0, max_tokens=25, ignore_eos=True)
    whole = tiny.generate([{"prompt_token_ids": prompts[1]}], cut)[0].outputs[0].text
    stop = whole[len(whole) // 2 : len(whole) // 2 + 2]
    if stop.strip("\ufffd"):
        stopped = tiny.generate([{"prompt_token_ids": prompts[1]}],
                                SamplingParams(temperature=0.0, max_tokens=25, ignore_eos=True, stop=[stop]))[0]
        assert whole.startswith(stopped.outputs[0].text) and stopped.outputs[0].finish_reason == "stop"
