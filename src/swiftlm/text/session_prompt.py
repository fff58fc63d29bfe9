"""How a session's next-turn prompt is formed.

Qwen3's chat template re-renders earlier assistant turns *without* their reasoning (and without
the empty ``<think>\\n\\n</think>\\n\\n`` block of a non-thinking turn). Turn N+1 rendered fresh is
therefore not a token prefix of what the model actually saw and produced in turn N, and a KV
cache keyed on tokens could reuse nothing past turn N's prompt.

A session instead extends the *real* token stream:

    prompt(N+1) = stream(N) without its final end-of-turn token
                  + tokenize(template text from the end of the last assistant message onward)

    stream(N):   <|im_start|>user\\nQ1<|im_end|>\\n<|im_start|>assistant\\n<think>...</think>\\n\\nA1<|im_end|>
    appended:    <|im_end|>\\n<|im_start|>user\\nQ2<|im_end|>\\n<|im_start|>assistant\\n

The appended text is cut from the template's own rendering of the full conversation (located
with a sentinel placed at the end of the last assistant message's content), so system prompts,
tool results and the generation prompt are exactly what the template would produce. The model
keeps seeing its earlier reasoning, as it did while generating; a conversation sent without a
session sees the template's reasoning-free history instead. So a session turn equals the same
token prompt sent fresh, not the fresh template rendering.

Which conversation a request means (``conversation``): the session keeps the transcript of the
conversation it recorded (system prompt, earlier turns, the answers returned), so a client may send
either the whole conversation or only the new messages:

- a request that carries no assistant message, for a live recorded session, is *appended* to the
  transcript (leading system messages equal to the transcript's are not repeated): the articles'
  clients send only the new question with the same ``session_id``;
- a request that carries a history is taken as it is: it continues the session when the history
  matches the transcript (same earlier messages, the assistant answer equal to what was returned),
  and is rendered fresh when it does not (an edited or trimmed history is never appended to, so
  never doubled); the session then starts over from it;
- ``reset`` (the ``session_reset`` field) forgets the transcript first: the request's messages are
  the whole conversation.

The session's stream is used only when the conversation extends the recorded one; otherwise the
prompt is rendered fresh and the session starts over from it.

Who owns what: the session's token stream lives in one place, the KV cache's session store
(``swiftlm.cache.sessions``), which pins its KV, expires it (TTL) and releases it (memory
pressure). ``SessionPrompts`` keeps only what it needs to tell whether a request extends the
recorded conversation (the messages, the tools, and a fingerprint of the stream the turn ended
with) and reads the stream through ``tokens_of(session_id)``, a callable the engine provides
(``Engine.session_tokens``). When the cache no longer holds the session, or holds a stream other
than the recorded turn's (a turn that finished without being recorded), the next turn is rendered
fresh and the record is forgotten. This layer imports neither the cache nor the engine.

Replicas of a cluster also keep transcripts in a store they all read (``transcripts``, a
``TranscriptStore``: ``swiftlm.server.session_transcripts``): a turn is written there once
recorded, and a request for a session this process holds no record of (its replica died, or its
key moved here) is read against the stored transcript, then prefilled afresh. A local record that
differs from the stored one is stale (the session took turns on another replica since) and is
dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from swiftlm.text.tokenizer import Tokenizer

_SENTINEL = "\u2063swiftlm-session-split\u2063"

TokensOf = Callable[[str], list[int] | None]
"""A session's real token stream as the cache holds it, or None if it holds none."""


class TranscriptStore(Protocol):
    """Sessions' transcripts shared by processes (``swiftlm.server.session_transcripts``)."""

    def load(self, session: str) -> list[dict[str, Any]] | None: ...

    def save(self, session: str, messages: list[dict[str, Any]]) -> None: ...

    def delete(self, session: str) -> None: ...


@dataclass(frozen=True, slots=True)
class _Turn:
    messages: list[dict[str, Any]]  # the conversation through the assistant answer returned
    tools_key: str
    stream_key: tuple[int, int]  # length and hash of the stream the turn ended with (not the stream)


def _as_json(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as a JSON store gives them back (tuples as lists), to compare with a stored copy."""
    return json.loads(json.dumps(messages, ensure_ascii=False))


def _comparable(message: dict[str, Any]) -> tuple:
    content = message.get("content")
    if isinstance(content, str):
        content = content.strip()
    elif content is None:
        content = ""  # an assistant message that only carries tool calls: null or ""
    calls = tuple(_comparable_call(call) for call in message.get("tool_calls") or ())
    return (message.get("role"), content, calls, message.get("tool_call_id"))


def _comparable_call(call: dict[str, Any]) -> tuple[Any, str]:
    """A tool call by name and arguments (ids are the client's to keep; arguments sent back as a
    JSON string or an object compare equal)."""
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return function.get("name"), arguments
    return function.get("name"), json.dumps(arguments, sort_keys=True)


class SessionPrompts:
    """Remembers each session's last turn and forms the next turn's prompt from it and the
    session's token stream, read through ``tokens_of`` (the cache owns the stream)."""

    SWEEP_EVERY = 256  # records between sweeps for transcripts of sessions the cache let go

    def __init__(
        self, tokenizer: Tokenizer, tokens_of: TokensOf, max_sessions: int = 10_000,
        transcripts: TranscriptStore | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tokens_of = tokens_of
        self.max_sessions = max_sessions
        self.transcripts = transcripts
        self._turns: dict[str, _Turn] = {}
        self._records = 0

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._turns

    def conversation(
        self, session_id: str | None, messages: Sequence[dict[str, Any]], reset: bool = False
    ) -> list[dict[str, Any]]:
        """The whole conversation a request's ``messages`` mean for ``session_id`` (see the module
        docstring): the recorded transcript followed by the messages when they carry no assistant
        message and the session is live; else the messages as sent. ``reset`` forgets the
        session's record first."""
        if session_id is None:
            return list(messages)
        if reset:
            self.forget(session_id)
            return list(messages)
        if any(m.get("role") == "assistant" for m in messages):
            return list(messages)
        recorded = self._recorded(session_id)
        stored = self.transcripts.load(session_id) if self.transcripts is not None else None
        if stored is not None and (recorded is None or stored != _as_json(recorded[0].messages)):
            self._turns.pop(session_id, None)  # stale: the session took turns elsewhere since
            transcript = stored  # prefilled afresh (no local record: ``prompt`` renders it whole)
        elif recorded is not None:
            transcript = recorded[0].messages
        else:
            return list(messages)
        skip = 0
        while (
            skip < len(messages) - 1
            and skip < len(transcript)
            and messages[skip].get("role") == "system"
            and _comparable(messages[skip]) == _comparable(transcript[skip])
        ):
            skip += 1  # the same system prompt, sent again with the new question
        return [*(dict(m) for m in transcript), *messages[skip:]]

    def prompt(
        self,
        session_id: str | None,
        messages: Sequence[dict[str, Any]],
        template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> tuple[str, list[int]]:
        """The prompt text (for logs) and token ids of the next turn."""
        kwargs = dict(template_kwargs or {})
        text = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tools=tools, **kwargs)
        recorded = self._recorded(session_id) if session_id is not None else None
        if recorded is not None and self._extends(recorded[0], messages, tools):
            turn, stream = recorded
            ended = bool(stream) and stream[-1] in self.tokenizer.eos_token_ids
            end_text = self.tokenizer.decode(stream[-1:], skip_special_tokens=False) if ended else None
            appended = self._appended_text(messages, len(turn.messages) - 1, kwargs, tools, end_text)
            if appended is not None:
                if ended:
                    stream = stream[:-1]  # the template writes the end-of-turn token itself
                return text, [*stream, *self.tokenizer.encode(appended)]
        return text, self.tokenizer.encode(text)

    def record(
        self,
        session_id: str,
        messages: Sequence[dict[str, Any]],
        answer: str,
        token_ids: Sequence[int],
        tools: list[dict[str, Any]] | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> None:
        """After a turn: the conversation now ends with ``answer`` (the content returned) and the
        ``tool_calls`` returned (OpenAI's shape), and ``token_ids`` (prompt + generated tokens) is
        the stream it ended with. Only a fingerprint of the stream is kept, to recognise it in the
        cache."""
        self._records += 1
        if self._records % self.SWEEP_EVERY == 0:
            self.sweep()
        if len(self._turns) >= self.max_sessions and session_id not in self._turns:
            self._turns.pop(next(iter(self._turns)))
        answered: dict[str, Any] = {"role": "assistant", "content": answer}
        if tool_calls:
            answered["tool_calls"] = [dict(call) for call in tool_calls]
        history = [dict(m) for m in messages] + [answered]
        self._turns[session_id] = _Turn(history, _tools_key(tools), _stream_key(token_ids))
        if self.transcripts is not None:
            self.transcripts.save(session_id, _as_json(history))

    def forget(self, session_id: str) -> None:
        """Forget the session's conversation (DELETE /v1/sessions, ``session_reset``), shared copy included."""
        self._turns.pop(session_id, None)
        if self.transcripts is not None:
            self.transcripts.delete(session_id)

    def sweep(self) -> int:
        """Forget the transcripts of sessions the cache no longer holds (expired, never resumed);
        returns how many."""
        gone = [sid for sid in self._turns if self.tokens_of(sid) is None]
        for sid in gone:
            del self._turns[sid]
        return len(gone)

    def _recorded(self, session_id: str) -> tuple[_Turn, list[int]] | None:
        """The recorded turn and the cache's stream for it; None (and the record forgotten) when
        the cache no longer holds the session or holds another stream."""
        turn = self._turns.get(session_id)
        if turn is None:
            return None
        stream = self.tokens_of(session_id)
        if stream is None or _stream_key(stream) != turn.stream_key:
            self._turns.pop(session_id, None)  # the local record only: a shared transcript outlives the KV
            return None
        return turn, stream

    def _extends(self, turn: _Turn, messages: Sequence[dict[str, Any]], tools: list | None) -> bool:
        n = len(turn.messages)
        if len(messages) <= n or _tools_key(tools) != turn.tools_key:
            return False
        if messages[n - 1].get("role") != "assistant":
            return False
        return all(_comparable(a) == _comparable(b) for a, b in zip(turn.messages, messages[:n], strict=True))

    def _appended_text(
        self,
        messages: Sequence[dict[str, Any]],
        assistant_index: int,
        kwargs: dict[str, Any],
        tools: list | None,
        end_text: str | None,
    ) -> str | None:
        """The template's text after the assistant message's end. An answer with tool calls is
        rendered as its content followed by the calls (in the template's own spelling, not the
        model's), so there the text is cut at the end-of-turn token (``end_text``) that follows."""
        marked = [dict(m) for m in messages]
        marked[assistant_index]["content"] = (marked[assistant_index].get("content") or "") + _SENTINEL
        text = self.tokenizer.apply_chat_template(marked, add_generation_prompt=True, tools=tools, **kwargs)
        at = text.find(_SENTINEL)
        if at < 0 or text.count(_SENTINEL) != 1:
            return None
        if not marked[assistant_index].get("tool_calls"):
            return text[at + len(_SENTINEL) :]
        if not end_text:
            return None
        end = text.find(end_text, at)
        return text[end:] if end >= 0 else None


def _tools_key(tools: list[dict[str, Any]] | None) -> str:
    return repr(tools) if tools else ""


def _stream_key(token_ids: Sequence[int]) -> tuple[int, int]:
    return len(token_ids), hash(tuple(token_ids))
