"""Session prompts read the token stream from the cache's session store, its one owner (no model).

A turn is simulated: its prompt from ``SessionPrompts``, an answer's tokens appended, the stream
pinned in the store as the engine does when the turn finishes, the turn recorded as the server does.
"""

from __future__ import annotations

from typing import Any

import pytest

from swiftlm.cache.kv_manager import KVCacheManager
from swiftlm.text.session_prompt import SessionPrompts
from swiftlm.text.tokenizer import Tokenizer

BS = 4
TTL = 10.0
KWARGS = {"enable_thinking": False}
SYSTEM = {"role": "system", "content": "You answer briefly."}


class Clock:
    now = 0.0


@pytest.fixture
def kv() -> KVCacheManager:
    return KVCacheManager(64, BS, session_ttl=TTL, max_session_tokens=10_000)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def prompts(qwen3_tokenizer: Tokenizer, kv: KVCacheManager, clock: Clock) -> SessionPrompts:
    return SessionPrompts(qwen3_tokenizer, lambda sid: kv.sessions.tokens(sid, clock.now))


def fresh_ids(tokenizer: Tokenizer, messages: list[dict[str, Any]]) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, **KWARGS))


def finish_turn(
    prompts: SessionPrompts, kv: KVCacheManager, sid: str, messages: list[dict[str, Any]], answer: str, now: float
) -> list[int]:
    """Run one turn: returns the stream it ended with (pinned in the store and recorded)."""
    tokenizer = prompts.tokenizer
    _, ids = prompts.prompt(sid, messages, KWARGS)
    stream = ids + tokenizer.encode(answer) + [tokenizer.eos_token_ids[0]]
    num_computed = len(stream) - 1
    kv.sessions.put(sid, list(stream), kv.pool.allocate(-(-num_computed // BS)), num_computed, now)
    prompts.record(sid, messages, answer, stream)
    return stream


def two_turns(prompts: SessionPrompts, kv: KVCacheManager, sid: str = "s") -> tuple[list[dict], list[int]]:
    """Turn 1 finished at time 0; the messages of turn 2 and the stream of turn 1."""
    messages = [SYSTEM, {"role": "user", "content": "你好"}]
    stream = finish_turn(prompts, kv, sid, messages, "Hello!", now=0.0)
    return [*messages, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "再见"}], stream


def test_a_live_session_extends_the_cached_stream(prompts, kv, clock) -> None:
    messages, stream = two_turns(prompts, kv)
    clock.now = TTL  # exactly the TTL: still alive
    _, ids = prompts.prompt("s", messages, KWARGS)
    assert ids[: len(stream) - 1] == stream[:-1]
    # the fresh rendering drops turn 1's empty think block, so it is not an extension of the stream
    assert fresh_ids(prompts.tokenizer, messages)[: len(stream) - 1] != stream[:-1]
    assert "s" in prompts


def test_a_session_expired_by_ttl_renders_fresh(prompts, kv, clock) -> None:
    messages, stream = two_turns(prompts, kv)
    clock.now = TTL + 0.5  # expired, though the engine has not swept it yet
    assert kv.sessions.tokens("s", clock.now) is None and "s" in kv.sessions
    _, ids = prompts.prompt("s", messages, KWARGS)
    assert ids == fresh_ids(prompts.tokenizer, messages)
    assert ids[: len(stream) - 1] != stream[:-1]  # no stale tokens
    assert "s" not in prompts  # the record is forgotten


def test_a_session_swept_by_expire_renders_fresh(prompts, kv, clock) -> None:
    messages, _ = two_turns(prompts, kv)
    assert kv.sessions.expire(now=TTL + 1.0) == 1
    assert prompts.prompt("s", messages, KWARGS)[1] == fresh_ids(prompts.tokenizer, messages)
    assert "s" not in prompts


def test_a_session_released_for_memory_renders_fresh(prompts, kv) -> None:
    messages, _ = two_turns(prompts, kv, "old")
    two_turns(prompts, kv, "new")
    assert kv.sessions.release_oldest()  # memory pressure takes the least recently used
    assert prompts.prompt("old", messages, KWARGS)[1] == fresh_ids(prompts.tokenizer, messages)
    assert "old" not in prompts
    assert prompts.prompt("new", messages, KWARGS)[1] != fresh_ids(prompts.tokenizer, messages)


def test_a_closed_session_is_dropped_from_both(prompts, kv) -> None:
    messages, _ = two_turns(prompts, kv)
    prompts.forget("s")
    assert kv.sessions.close("s")
    assert "s" not in prompts and "s" not in kv.sessions
    assert prompts.prompt("s", messages, KWARGS)[1] == fresh_ids(prompts.tokenizer, messages)


def test_closed_in_the_cache_alone_is_dropped_at_the_next_turn(prompts, kv) -> None:
    messages, _ = two_turns(prompts, kv)
    assert kv.sessions.close("s")
    assert prompts.prompt("s", messages, KWARGS)[1] == fresh_ids(prompts.tokenizer, messages)
    assert "s" not in prompts


def test_a_checked_out_session_renders_fresh(prompts, kv) -> None:
    """While a turn of the session runs, the request owns its blocks and the store holds no stream."""
    messages, stream = two_turns(prompts, kv)
    assert kv.sessions.take("s", stream, now=1.0) is not None
    assert prompts.prompt("s", messages, KWARGS)[1] == fresh_ids(prompts.tokenizer, messages)


def test_a_stream_other_than_the_recorded_turns_renders_fresh(prompts, kv) -> None:
    """A turn the engine finished but nobody recorded (client gone): the store's stream no longer
    belongs to the recorded conversation."""
    messages, stream = two_turns(prompts, kv)
    unrecorded = stream + prompts.tokenizer.encode("\nuser\nmore") + [prompts.tokenizer.eos_token_ids[0]]
    kv.sessions.put("s", unrecorded, kv.pool.allocate(-(-(len(unrecorded) - 1) // BS)), len(unrecorded) - 1, 0.0)
    assert prompts.prompt("s", messages, KWARGS)[1] == fresh_ids(prompts.tokenizer, messages)
    assert "s" not in prompts



# ---------------------------------------------------------------- which conversation a request means


def test_only_the_new_messages_are_appended_to_the_transcript(prompts, kv) -> None:
    messages, stream = two_turns(prompts, kv)
    new = [{"role": "user", "content": "再见"}]
    conversation = prompts.conversation("s", new)
    assert conversation == messages  # system + turn 1 + the new question
    text, ids = prompts.prompt("s", conversation, KWARGS)
    assert ids[: len(stream) - 1] == stream[:-1]  # extends the real stream
    assert "你好" in text and "Hello!" in text and "再见" in text


def test_a_resent_system_prompt_is_not_repeated(prompts, kv) -> None:
    messages, _ = two_turns(prompts, kv)
    assert prompts.conversation("s", [SYSTEM, {"role": "user", "content": "再见"}]) == messages
    other = {"role": "system", "content": "From now on, answer in French."}
    assert prompts.conversation("s", [other, messages[-1]]) == [*messages[:-1], other, messages[-1]]


def test_a_matching_history_continues_and_an_edited_one_renders_fresh(prompts, kv) -> None:
    messages, stream = two_turns(prompts, kv)
    assert prompts.conversation("s", messages) == messages  # a history is taken as sent
    assert prompts.prompt("s", messages, KWARGS)[1][: len(stream) - 1] == stream[:-1]
    edited = [*messages[:2], {"role": "assistant", "content": "Hi, how can I help?"}, messages[-1]]
    assert prompts.conversation("s", edited) == edited  # never appended to the transcript
    assert prompts.prompt("s", edited, KWARGS)[1] == fresh_ids(prompts.tokenizer, edited)
    trimmed = messages[1:]  # the system prompt dropped
    assert prompts.conversation("s", trimmed) == trimmed
    assert prompts.prompt("s", trimmed, KWARGS)[1] == fresh_ids(prompts.tokenizer, trimmed)


def test_reset_starts_the_conversation_over(prompts, kv) -> None:
    two_turns(prompts, kv)
    new = [{"role": "user", "content": "再见"}]
    assert prompts.conversation("s", new, reset=True) == new
    assert "s" not in prompts
    assert prompts.prompt("s", new, KWARGS)[1] == fresh_ids(prompts.tokenizer, new)


def test_new_messages_without_a_live_session_are_the_whole_conversation(prompts, kv, clock) -> None:
    new = [{"role": "user", "content": "再见"}]
    assert prompts.conversation("never-opened", new) == new
    assert prompts.conversation(None, new) == new
    two_turns(prompts, kv)
    clock.now = TTL + 1.0  # expired: the transcript went with the KV
    assert prompts.conversation("s", new) == new
    assert "s" not in prompts


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": -3}'}


def tool_turn(prompts: SessionPrompts, kv: KVCacheManager) -> tuple[list[dict], list[int]]:
    """Turn 1 answered with a tool call (content empty), recorded as the chat route does."""
    messages = [SYSTEM, {"role": "user", "content": "Weather in Oslo?"}]
    tokenizer = prompts.tokenizer
    _, ids = prompts.prompt("s", messages, KWARGS, TOOLS)
    stream = ids + tokenizer.encode(CALL_TEXT) + [tokenizer.eos_token_ids[0]]
    kv.sessions.put("s", list(stream), kv.pool.allocate(-(-(len(stream) - 1) // BS)), len(stream) - 1, 0.0)
    prompts.record("s", messages, "", stream, TOOLS, tool_calls=[CALL])
    return messages, stream


@pytest.mark.parametrize("sent", ["tool results only", "whole history"])
def test_a_turn_answered_with_tool_calls_continues_with_the_tool_results(prompts, kv, sent: str) -> None:
    messages, stream = tool_turn(prompts, kv)
    answered = {"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": "call_other"}]}
    request = [TOOL_RESULT] if sent == "tool results only" else [*messages, answered, TOOL_RESULT]
    conversation = prompts.conversation("s", request)
    assert [m["role"] for m in conversation] == ["system", "user", "assistant", "tool"]
    _, ids = prompts.prompt("s", conversation, KWARGS, TOOLS)
    assert ids[: len(stream) - 1] == stream[:-1]
    appended = prompts.tokenizer.decode(ids[len(stream) - 1 :], skip_special_tokens=False)
    fresh = prompts.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tools=TOOLS, **KWARGS)
    assert appended.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>")
    assert fresh.endswith(appended)  # the tool result and the generation prompt as the template writes them


def test_other_tool_calls_in_the_history_render_fresh(prompts, kv) -> None:
    messages, stream = tool_turn(prompts, kv)
    other = {**CALL, "function": {"name": "get_weather", "arguments": '{"city": "Bergen"}'}}
    conversation = [*messages, {"role": "assistant", "content": None, "tool_calls": [other]}, TOOL_RESULT]
    _, ids = prompts.prompt("s", conversation, KWARGS, TOOLS)
    assert ids == fresh_ids_with_tools(prompts.tokenizer, conversation)


def fresh_ids_with_tools(tokenizer: Tokenizer, messages: list[dict[str, Any]]) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=TOOLS, **KWARGS))


def test_transcripts_of_sessions_the_cache_let_go_are_swept(prompts: SessionPrompts, kv: KVCacheManager,
                                                              clock: Clock) -> None:
    """A session that expires and is never resumed does not keep its transcript forever."""
    for i in range(3):
        finish_turn(prompts, kv, f"old-{i}", [SYSTEM, {"role": "user", "content": f"q{i}"}], "a", now=0.0)
    clock.now = TTL + 1
    kv.sessions.expire(clock.now)
    finish_turn(prompts, kv, "live", [SYSTEM, {"role": "user", "content": "q"}], "a", now=clock.now)
    assert "old-0" in prompts  # not looked at yet
    assert prompts.sweep() == 3
    assert "live" in prompts and not any(f"old-{i}" in prompts for i in range(3))
    finish_turn(prompts, kv, "old-x", [SYSTEM, {"role": "user", "content": "qx"}], "a", now=clock.now)
    clock.now = 2 * TTL + 2
    kv.sessions.expire(clock.now)
    for i in range(prompts.SWEEP_EVERY):  # record() sweeps by itself now and then
        prompts.record(f"s{i % 2}", [SYSTEM], "a", [1, 2, 3])
    assert "old-x" not in prompts
