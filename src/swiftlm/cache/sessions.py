"""Sessions: a conversation's KV kept warm between its turns.

A session is a pinned handle on the blocks of the conversation's *real* token stream, the prompt
plus every token the model produced (reasoning included), partial last block included:

    token_ids: | prompt of turn N ............ | output of turn N (ends in <|im_end|>) |
    computed:  | KV in blocks ........................................... |  last token |

The last sampled token was never run through the model, so ``num_computed = len(token_ids) - 1``.
Turn N+1's prompt extends this stream (see ``swiftlm.text.session_prompt``) and only the tokens it
adds are computed. While a turn runs, its session is checked out (the request owns the blocks);
when the turn ends, the request's blocks are pinned again under the session.

Pinning is reference counting: a session holds one reference on each of its blocks, so they are
never evicted; releasing the session drops the references (full blocks stay in the prefix cache
until their space is needed).

This store is the one owner of a session's token stream. The text layer
(``swiftlm.text.session_prompt``) keeps only the conversation's messages and reads the stream
from here (``tokens``, through ``Engine.session_tokens``) when it forms the next turn's prompt;
so a session expired (TTL), released (memory pressure, the session budget), closed, or diverged
from here is gone for both, and its next turn is rendered fresh. ``tokens`` may be called from
another thread than the engine's: it is one dict lookup, and a session's ``token_ids`` list is
never changed after ``put`` (a new turn stores a new ``Session``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from swiftlm.cache.block_pool import BlockPool


@dataclass(slots=True)
class Session:
    session_id: str
    token_ids: list[int]
    block_ids: list[int]
    num_computed: int
    last_used: float


@dataclass(frozen=True, slots=True)
class SessionHit:
    block_ids: list[int]  # the request now owns these references
    num_computed: int


class SessionStore:
    def __init__(self, pool: BlockPool, block_size: int, ttl: float, max_tokens: int) -> None:
        self.pool = pool
        self.block_size = block_size
        self.ttl = ttl
        self.max_tokens = max_tokens
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    @property
    def num_tokens(self) -> int:
        return sum(s.num_computed for s in self._sessions.values())

    def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def tokens(self, session_id: str, now: float) -> list[int] | None:
        """The session's real token stream (prompt + output of its last turn; do not change it),
        or None if no live session holds it: never opened, expired by ``now``, released, closed,
        or checked out by a turn still running."""
        session = self._sessions.get(session_id)
        if session is None or now - session.last_used > self.ttl:
            return None
        return session.token_ids

    def pinned_blocks(self) -> set[int]:
        return {b for s in self._sessions.values() for b in s.block_ids}

    def reusable(self, session_id: str, prompt_ids: Sequence[int], now: float) -> tuple[int, int]:
        """How much of the session a new turn with ``prompt_ids`` can reuse: (tokens, blocks).

        The longest common prefix of the session's computed tokens and the prompt, at most
        ``len(prompt) - 1`` so the last prompt token is computed. A block that would be only
        partly reused is kept only if it is the session's unkeyed, unshared tail block, since
        the new turn overwrites its later slots.
        """
        session = self._sessions.get(session_id)
        if session is None or now - session.last_used > self.ttl:
            return 0, 0
        limit = min(session.num_computed, len(prompt_ids) - 1)
        common = 0
        while common < limit and session.token_ids[common] == prompt_ids[common]:
            common += 1
        bs = self.block_size
        n_blocks = (common + bs - 1) // bs
        if common % bs and n_blocks:
            last = session.block_ids[n_blocks - 1]
            if self.pool.key_of(last) is not None or self.pool.ref_count(last) > 1:
                n_blocks -= 1  # a shared or cached full block must not be overwritten
                common = n_blocks * bs
        return common, n_blocks

    def take(self, session_id: str, prompt_ids: Sequence[int], now: float) -> SessionHit | None:
        """Check the session out for a new turn: the request takes over the reusable blocks'
        references, the rest are released. None (and the session released) if nothing is reusable."""
        common, n_blocks = self.reusable(session_id, prompt_ids, now)
        session = self._sessions.pop(session_id, None)
        if session is None:
            return None
        keep, drop = session.block_ids[:n_blocks], session.block_ids[n_blocks:]
        self.pool.free(reversed(drop))
        if common == 0:
            return None
        return SessionHit(block_ids=keep, num_computed=common)

    def put(self, session_id: str, token_ids: list[int], block_ids: list[int], num_computed: int, now: float) -> None:
        """Pin a finished turn's blocks (the caller's references move to the session)."""
        old = self._sessions.pop(session_id, None)
        if old is not None:  # a concurrent turn of the same session ran without it: keep the newest
            self.pool.free(reversed(old.block_ids))
        n_blocks = (num_computed + self.block_size - 1) // self.block_size
        self.pool.free(reversed(block_ids[n_blocks:]))
        self._sessions[session_id] = Session(session_id, token_ids, block_ids[:n_blocks], num_computed, now)
        while self.num_tokens > self.max_tokens and self._sessions:
            self.release_oldest()

    def trim(self, session_id: str, token_ids: Sequence[int]) -> None:
        """Cut a session back to ``token_ids`` when its stream extends them (a turn the front end
        ended on a stop string after the engine had run past it): the tokens and KV after them go.
        A session holding any other stream is left alone."""
        session = self._sessions.get(session_id)
        n = len(token_ids)
        if session is None or len(session.token_ids) <= n or session.token_ids[:n] != list(token_ids):
            return
        num_computed = min(session.num_computed, n - 1)
        n_blocks = (num_computed + self.block_size - 1) // self.block_size
        self.pool.free(reversed(session.block_ids[n_blocks:]))
        # a new Session, not an edit: readers on other threads hold the old token list
        self._sessions[session_id] = Session(session_id, list(token_ids), session.block_ids[:n_blocks], num_computed,
                                             session.last_used)

    def close(self, session_id: str) -> bool:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        self.pool.free(reversed(session.block_ids))
        return True

    def all(self) -> list[Session]:
        return list(self._sessions.values())

    def release_oldest(self, exclude: str | None = None) -> bool:
        """Release the least recently used session (memory pressure). False if there is none."""
        victim = next((sid for sid in self._sessions if sid != exclude), None)
        if victim is None:
            return False
        return self.close(victim)

    def expire(self, now: float) -> int:
        expired = [sid for sid, s in self._sessions.items() if now - s.last_used > self.ttl]
        for sid in expired:
            self.close(sid)
        return len(expired)
