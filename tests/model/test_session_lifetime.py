"""A session's token stream has one owner, the cache: when it expires or closes there, the next
turn is a fresh render, with no stale tokens (tiny random checkpoint)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from swiftlm import LLM, SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
OFF = {"enable_thinking": False}


def first_turn(llm: LLM) -> tuple[list[dict[str, Any]], list[int]]:
    """Turn 1 in session "s"; the messages of turn 2 and the stream turn 1 ended with."""
    messages = [{"role": "system", "content": "You are terse. " * 10}, {"role": "user", "content": "你好"}]
    out = llm.chat(messages, PARAMS, OFF, session_id="s")
    stream = out.prompt_token_ids + out.outputs[0].token_ids
    messages += [{"role": "assistant", "content": out.outputs[0].text}, {"role": "user", "content": "再见"}]
    return messages, stream


def fresh_render(llm: LLM, messages: list[dict[str, Any]]) -> list[int]:
    return llm.tokenizer.encode(llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, **OFF))


def test_live_session_extends_the_cached_stream(tiny_tied_dir: Path) -> None:
    llm = LLM(str(tiny_tied_dir), dtype="float32")
    messages, stream = first_turn(llm)
    assert llm.engine.session_tokens("s") == stream
    ids = llm.chat_prompt(messages, OFF, session_id="s")["prompt_token_ids"]
    assert ids[: len(stream) - 1] == stream[:-1] and ids != fresh_render(llm, messages)


def test_session_expired_in_the_cache_makes_the_next_turn_fresh(tiny_tied_dir: Path) -> None:
    llm = LLM(str(tiny_tied_dir), dtype="float32")
    messages, stream = first_turn(llm)
    sessions = llm.engine.kv.sessions
    assert sessions.expire(time.monotonic() + sessions.ttl + 1.0) == 1
    assert llm.engine.session_tokens("s") is None
    second = llm.chat(messages, PARAMS, OFF, session_id="s")
    assert second.prompt_token_ids == fresh_render(llm, messages)
    assert second.prompt_token_ids[: len(stream) - 1] != stream[:-1]  # no stale tokens
    # the fresh turn opened the session again: turn 3 extends turn 2's stream
    assert llm.engine.session_tokens("s") == second.prompt_token_ids + second.outputs[0].token_ids


def test_closed_session_is_dropped_from_both(tiny_tied_dir: Path) -> None:
    llm = LLM(str(tiny_tied_dir), dtype="float32")
    messages, _ = first_turn(llm)
    assert "s" in llm.engine.kv.sessions and "s" in llm._session_prompts
    assert llm.close_session("s")
    assert "s" not in llm.engine.kv.sessions and "s" not in llm._session_prompts
    assert llm.engine.session_tokens("s") is None
    assert llm.chat_prompt(messages, OFF, session_id="s")["prompt_token_ids"] == fresh_render(llm, messages)
    assert not llm.close_session("s")


def test_chat_with_only_the_new_message_equals_the_whole_conversation(tiny_tied_dir: Path) -> None:
    llm = LLM(str(tiny_tied_dir), dtype="float32")
    messages, stream = first_turn(llm)
    whole = llm.chat_prompt(messages, OFF, session_id="s")["prompt_token_ids"]
    second = llm.chat(messages[-1:], PARAMS, OFF, session_id="s")  # only "再见"
    assert second.prompt_token_ids == whole and whole[: len(stream) - 1] == stream[:-1]
    assert second.num_cached_tokens > 0
