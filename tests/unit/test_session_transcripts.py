"""Sessions' transcripts shared by replicas (no model): the SQLite store, and ``SessionPrompts`` on two
"replicas" (two instances, each with its own KV, one store) continuing each other's sessions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swiftlm.cache.kv_manager import KVCacheManager
from swiftlm.server.session_transcripts import SessionTranscripts
from swiftlm.text.session_prompt import SessionPrompts
from swiftlm.text.tokenizer import Tokenizer

BS = 4
KWARGS = {"enable_thinking": False}
SYSTEM = {"role": "system", "content": "You answer briefly."}


class Clock:
    now = 1000.0


class Replica:
    """One process: its own KV session store and ``SessionPrompts`` over the shared transcripts."""

    def __init__(self, tokenizer: Tokenizer, store: SessionTranscripts) -> None:
        self.kv = KVCacheManager(64, BS, session_ttl=600.0, max_session_tokens=10_000)
        self.prompts = SessionPrompts(tokenizer, lambda sid: self.kv.sessions.tokens(sid, 0.0), transcripts=store)

    def turn(self, sid: str, new: list[dict[str, Any]], answer: str) -> tuple[list[dict[str, Any]], list[int]]:
        """A turn as the server runs it: the conversation the new messages mean, its prompt ids, the
        stream pinned and the turn recorded. Returns the conversation and the prompt ids."""
        tokenizer = self.prompts.tokenizer
        messages = self.prompts.conversation(sid, new)
        _, ids = self.prompts.prompt(sid, messages, KWARGS)
        stream = ids + tokenizer.encode(answer) + [tokenizer.eos_token_ids[0]]
        self.kv.sessions.put(sid, list(stream), self.kv.pool.allocate(-(-(len(stream) - 1) // BS)), len(stream) - 1, 0.0)
        self.prompts.record(sid, messages, answer, stream)
        return messages, ids


def fresh_ids(tokenizer: Tokenizer, messages: list[dict[str, Any]]) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, **KWARGS))


def test_store_round_trip_ttl_delete_and_a_second_process(tmp_path: Path) -> None:
    clock = Clock()
    store = SessionTranscripts(tmp_path, ttl_s=60.0, clock=lambda: clock.now)
    other = SessionTranscripts(tmp_path, ttl_s=60.0, clock=lambda: clock.now)  # another replica, same file
    messages = [SYSTEM, {"role": "user", "content": "你好"}, {"role": "assistant", "content": "Hi!"}]
    assert store.load("k/s") is None
    store.save("k/s", messages)
    assert other.load("k/s") == messages
    assert other.load("other-key/s") is None  # the key's scope is part of the session key
    clock.now += 60.0
    assert other.load("k/s") == messages  # idle exactly the TTL: still served
    clock.now += 0.5
    assert other.load("k/s") is None  # idle past the TTL
    store.save("k/s", messages[:2])
    other.delete("k/s")
    assert store.load("k/s") is None
    store.close()
    other.close()


def test_a_replica_that_never_saw_the_session_continues_it_from_the_new_message_alone(
    qwen3_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    store = SessionTranscripts(tmp_path, ttl_s=600.0)
    a, b = Replica(qwen3_tokenizer, store), Replica(qwen3_tokenizer, store)
    a.turn("k/s", [SYSTEM, {"role": "user", "content": "My name is Ada."}], "Hello Ada!")
    # replica a died; the next turn (only the new question, as the articles' clients send it) reaches b
    question = {"role": "user", "content": "What is my name?"}
    messages, ids = b.turn("k/s", [question], "Ada.")
    assert messages == [SYSTEM, {"role": "user", "content": "My name is Ada."},
                        {"role": "assistant", "content": "Hello Ada!"}, question]
    assert ids == fresh_ids(qwen3_tokenizer, messages)  # b holds no KV of it: a fresh prefill of the whole
    # without the shared store, b would have seen the new question alone
    alone = SessionPrompts(qwen3_tokenizer, lambda sid: None)
    assert alone.conversation("k/s", [question]) == [question]


def test_a_stale_local_record_gives_way_to_the_turns_taken_elsewhere(qwen3_tokenizer: Tokenizer, tmp_path: Path) -> None:
    store = SessionTranscripts(tmp_path, ttl_s=600.0)
    a, b = Replica(qwen3_tokenizer, store), Replica(qwen3_tokenizer, store)
    a.turn("k/s", [SYSTEM, {"role": "user", "content": "one"}], "1")
    b.turn("k/s", [{"role": "user", "content": "two"}], "2")  # the key moved to b for a turn
    messages, ids = a.turn("k/s", [{"role": "user", "content": "three"}], "3")  # and back to a
    assert [m["content"] for m in messages] == ["You answer briefly.", "one", "1", "two", "2", "three"]
    assert ids == fresh_ids(qwen3_tokenizer, messages)  # a's own stream ended at turn 1: not extended
    # the next turn on a, which now holds the latest record, extends its stream again
    messages, ids = a.turn("k/s", [{"role": "user", "content": "four"}], "4")
    assert [m["content"] for m in messages][-3:] == ["three", "3", "four"]
    assert ids != fresh_ids(qwen3_tokenizer, messages)  # the real stream (turn 3's empty think block kept)


def test_forgetting_a_session_forgets_its_shared_transcript(qwen3_tokenizer: Tokenizer, tmp_path: Path) -> None:
    store = SessionTranscripts(tmp_path, ttl_s=600.0)
    a, b = Replica(qwen3_tokenizer, store), Replica(qwen3_tokenizer, store)
    a.turn("k/s", [{"role": "user", "content": "one"}], "1")
    a.prompts.forget("k/s")  # DELETE /v1/sessions/s, or session_reset
    assert store.load("k/s") is None
    assert b.prompts.conversation("k/s", [{"role": "user", "content": "two"}]) == [{"role": "user", "content": "two"}]
