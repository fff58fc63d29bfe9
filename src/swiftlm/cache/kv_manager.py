"""KVCacheManager: which blocks each request owns, with prefix-cache and session reuse.

Touches no tensors; the runner reads a request's ``block_ids`` to address the KV pools.
"""

from __future__ import annotations

from collections import Counter

from swiftlm.cache.block_pool import BlockPool
from swiftlm.cache.prefix_cache import PrefixCache
from swiftlm.cache.sessions import SessionStore
from swiftlm.core.request import Request


def blocks_for(num_tokens: int, block_size: int) -> int:
    return (num_tokens + block_size - 1) // block_size


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        session_ttl: float = 600.0,
        max_session_tokens: int | None = None,
    ) -> None:
        self.block_size = block_size
        # a partial match shares at least a quarter of a block: the children of a parent are indexed
        # by that many first tokens (under the parent None, one per cached conversation otherwise)
        self.pool = BlockPool(num_blocks, child_head=max(1, block_size // 4))
        self.prefix_cache = PrefixCache(self.pool, block_size, enable_prefix_caching)
        budget = max_session_tokens if max_session_tokens is not None else (num_blocks - 1) * block_size // 2
        self.sessions = SessionStore(self.pool, block_size, session_ttl, budget)
        # (source, destination) blocks to copy before the next step runs: a prefix hit that ends
        # inside a cached block takes a copy of it (its source referenced until copies_done)
        self.pending_copies: list[tuple[int, int]] = []

    @property
    def usage(self) -> float:
        return self.pool.usage

    # -- admission of a waiting request ---------------------------------------------------------
    def admit(self, request: Request, token_budget: int, now: float) -> int:
        """Give a waiting request (holding no blocks) its reusable KV and blocks for its next chunk.

        Reuse comes from the request's session or the prefix cache, whichever covers more. A
        request still owed prompt logprobs reuses nothing: reused KV has no logits, so its whole
        prompt is recomputed (in the same pass that scores it). Its blocks are still keyed in the
        prefix cache as they fill (a block whose key is already cached stays unkeyed), and its
        session, if any, is replaced by this request's blocks when it finishes.
        Returns the number of tokens to compute this step, or 0 if the blocks are not there (then
        nothing changed).
        """
        assert not request.block_ids and request.num_computed_tokens == 0 and request.num_pending == 0
        tokens = request.all_token_ids
        bs = self.block_size
        reuse = not request.needs_prompt_logprobs
        session_tokens = session_blocks = 0
        if request.session_id is not None and reuse:
            session_tokens, session_blocks = self.sessions.reusable(request.session_id, tokens, now)
        hits = self.prefix_cache.match(tokens, len(tokens) - 1) if reuse else []
        # the rest of a hit that ends inside a cached block: a copy of that block
        partial = self.prefix_cache.match_partial(tokens, hits, len(tokens) - 1) if reuse else None
        cached = len(hits) * bs + (partial[1] if partial is not None else 0)
        use_session = session_tokens > 0 and session_tokens >= cached
        if use_session:
            partial = None
        reused = session_tokens if use_session else cached
        num_new = min(len(tokens) - reused, token_budget)
        held = session_blocks if use_session else len(hits)
        need = blocks_for(reused + num_new, bs) - held
        keep = request.session_id if use_session else None
        taken = [] if use_session else hits + ([partial[0]] if partial is not None else [])
        short = need + self._free_hits(taken) - self.pool.num_free_blocks
        if short > 0 and self._releasable(keep, taken) < short:
            return 0  # releasing every idle session would not make room: keep them
        while self.pool.num_free_blocks < need + self._free_hits(taken):
            if not self.sessions.release_oldest(exclude=keep):
                return 0
        if use_session:
            hit = self.sessions.take(request.session_id, tokens, now)
            assert hit is not None and hit.num_computed == reused
            request.block_ids = hit.block_ids
            n_keyed = 0
            while n_keyed < len(hit.block_ids) and self.pool.key_of(hit.block_ids[n_keyed]) is not None:
                n_keyed += 1
        else:
            if request.session_id is not None:
                self.sessions.close(request.session_id)  # the conversation diverged from it
            self.pool.ref(hits)
            request.block_ids = list(hits)
            n_keyed = len(hits)
        request.num_registered_blocks = n_keyed
        key = self.pool.key_of(request.block_ids[n_keyed - 1]) if n_keyed else None
        request.last_block_hash = key.hash if key is not None else None
        request.num_computed_tokens = reused
        self.prefix_cache.queries += len(tokens)
        self.prefix_cache.hits += reused
        if partial is not None:
            self.pool.ref([partial[0]])  # kept from eviction until its copy is made
        request.block_ids.extend(self.pool.allocate(need))
        if partial is not None:
            self.pending_copies.append((partial[0], request.block_ids[len(hits)]))
        return num_new

    def copies_done(self) -> None:
        """The pending copies are made: release their sources."""
        if self.pending_copies:
            self.pool.free([src for src, _ in self.pending_copies])
            self.pending_copies = []

    def _free_hits(self, hits: list[int]) -> int:
        """Hit blocks now in the free queue: taking them shrinks the free queue too."""
        return sum(1 for b in hits if self.pool.ref_count(b) == 0)

    def _releasable(self, exclude: str | None, hits: list[int]) -> int:
        """Blocks that releasing every session but ``exclude`` would free, hit blocks not counted
        (a released hit block joins the free queue and leaves it again when the request takes it)."""
        pins = Counter(b for s in self.sessions.all() if s.session_id != exclude for b in s.block_ids)
        taken = set(hits)
        return sum(1 for b, n in pins.items() if n == self.pool.ref_count(b) and b not in taken)

    def _make_room(self, num_blocks: int) -> bool:
        """Ensure ``num_blocks`` free blocks, releasing idle sessions (oldest first) if needed."""
        while self.pool.num_free_blocks < num_blocks:
            if not self.sessions.release_oldest():
                return False
        return True

    # -- running requests -------------------------------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Blocks for ``num_new_tokens`` more tokens of a running request; False if there are none."""
        need = blocks_for(request.num_computed_tokens + num_new_tokens, self.block_size) - len(request.block_ids)
        if need <= 0:
            return True
        if not self._make_room(need):
            return False
        request.block_ids.extend(self.pool.allocate(need))
        return True

    def register_computed(self, request: Request) -> None:
        """Key the request's newly full, computed blocks in the prefix cache (confirmed tokens only:
        a launched step's KV is shared once its results are in)."""
        if request.num_confirmed_tokens < (request.num_registered_blocks + 1) * self.block_size:
            return  # no block became full since the last call (most decode steps)
        request.num_registered_blocks, request.last_block_hash = self.prefix_cache.register(
            request.all_token_ids,
            request.block_ids,
            request.num_confirmed_tokens,
            request.num_registered_blocks,
            request.last_block_hash,
        )

    def free(self, request: Request) -> None:
        """Drop the request's references, tail first so a sequence's last blocks are evicted first."""
        self.pool.free(reversed(request.block_ids))
        request.block_ids = []
        request.num_registered_blocks = 0
        request.last_block_hash = None

    def release_finished(self, request: Request, now: float) -> None:
        """A finished request's blocks go to its session (pinned) or back to the pool."""
        if request.session_id is not None and request.finish_reason in ("stop", "length"):
            self.sessions.put(
                request.session_id,
                list(request.all_token_ids),
                request.block_ids,
                request.num_computed_tokens,
                now,
            )
            request.block_ids = []
        else:
            if request.error is None:  # its computed rows of a last, partial block: a later prompt may copy them
                self.prefix_cache.register_partial(
                    request.all_token_ids, request.block_ids, request.num_computed_tokens,
                    request.num_registered_blocks, request.last_block_hash,
                )
            self.free(request)

    def check_integrity(self, requests: list[Request]) -> None:
        """Every reference is accounted for by a live request, a session, a pending copy's source or
        the null block."""
        self.pool.check_integrity()
        expected = [0] * self.pool.num_blocks
        expected[0] = 1
        for src, _ in self.pending_copies:
            expected[src] += 1
        for r in requests:
            for b in r.block_ids:
                expected[b] += 1
        for session in self.sessions.all():
            for b in session.block_ids:
                expected[b] += 1
        actual = [self.pool.ref_count(b) for b in range(self.pool.num_blocks)]
        assert actual == expected, "block references do not match their owners"
