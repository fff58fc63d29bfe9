"""Prefix cache: reuse the KV of full blocks whose token history matches a new prompt, and of the
block a match ends inside (a copy of it: ``match_partial``).

Block ``i`` of a sequence covers tokens ``[i * block_size, (i + 1) * block_size)``. Its key is
chained over every earlier block, so equal keys mean equal histories, confirmed by token ids:

    tokens:  | block 0 (16) | block 1 (16) | block 2 (16) | 5 more |
    keys:      k0 = H(None, t0) k1 = H(k0, t1) k2 = H(k1, t2)   (partial: no key)
"""

from __future__ import annotations

from collections.abc import Sequence

from swiftlm.cache.block_pool import BlockKey, BlockPool


def block_keys(
    token_ids: Sequence[int], block_size: int, start: int = 0, parent: int | None = None
) -> list[BlockKey]:
    """Keys of the full blocks ``start, start + 1, ...`` of ``token_ids``; ``parent`` is the hash
    of block ``start - 1`` (None for the first block)."""
    keys = []
    for lo in range(start * block_size, len(token_ids) - block_size + 1, block_size):
        key = BlockKey.of(parent, tuple(token_ids[lo : lo + block_size]))
        keys.append(key)
        parent = key.hash
    return keys


class PrefixCache:
    """Finds cached blocks for a prompt and registers a request's blocks as they fill."""

    def __init__(self, pool: BlockPool, block_size: int, enabled: bool = True) -> None:
        self.pool = pool
        self.block_size = block_size
        self.enabled = enabled
        self.queries = 0  # prompt tokens of admitted requests (metrics; counted by the caller)
        self.hits = 0  # of those, tokens whose KV was reused

    def match(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        """Block ids of the longest cached prefix of ``token_ids[:max_tokens]`` (whole blocks).

        The caller takes the references (``BlockPool.ref``). Callers pass ``max_tokens =
        len(prompt) - 1`` so the last prompt token is always computed and has logits to sample.
        """
        if not self.enabled:
            return []
        hits: list[int] = []
        parent = None
        limit = max_tokens - max_tokens % self.block_size
        for lo in range(0, limit, self.block_size):
            key = BlockKey.of(parent, tuple(token_ids[lo : lo + self.block_size]))
            block_id = self.pool.lookup(key)
            if block_id is None:
                break
            hits.append(block_id)
            parent = key.hash
        return hits

    def match_partial(self, token_ids: Sequence[int], hits: Sequence[int], max_tokens: int) -> tuple[int, int] | None:
        """A cached block that continues ``hits`` (``match``'s result) with the longest run of this
        prompt's next tokens, short of a whole block: ``(block id, tokens)``, or None when none shares
        its first ``pool.child_head`` tokens. Its first ``tokens`` rows are this prompt's next ones, so a copy of the block
        saves computing them (the copy's later rows are overwritten). Like ``match``, never past
        ``max_tokens``."""
        if not self.enabled:
            return None
        lo = len(hits) * self.block_size
        want = token_ids[lo : min(max_tokens, lo + self.block_size)]
        head = tuple(want[: self.pool.child_head])
        if len(head) < self.pool.child_head:
            return None  # fewer tokens left than a key's head
        parent = self.pool.key_of(hits[-1]).hash if hits else None
        best: tuple[int, int] | None = None
        for block_id in self.pool.children(parent, head):
            have = self.pool.key_of(block_id).token_ids
            n = 0
            while n < len(want) and n < len(have) and have[n] == want[n]:  # a partly computed block: fewer
                n += 1
            if best is None or n > best[1]:  # every candidate shares the head
                best = (block_id, n)
        return best

    def register_partial(
        self, token_ids: Sequence[int], block_ids: Sequence[int], num_computed: int, num_registered: int,
        last_hash: int | None,
    ) -> None:
        """Key a finished request's last block when it is partly computed (its whole blocks keyed
        before it), under its computed tokens: never a ``match`` hit (no whole block has those
        tokens), a ``match_partial`` candidate until the block is handed out again. A conversation's
        next turn, which extends this one's text, then copies those rows instead of computing them."""
        full, rows = divmod(num_computed, self.block_size)
        if not self.enabled or rows == 0 or num_registered != full or len(block_ids) <= full:
            return
        lo = full * self.block_size
        self.pool.cache(block_ids[full], BlockKey.of(last_hash, tuple(token_ids[lo : lo + rows])))

    def register(
        self,
        token_ids: Sequence[int],
        block_ids: Sequence[int],
        num_computed: int,
        num_registered: int,
        last_hash: int | None,
    ) -> tuple[int, int | None]:
        """Key the request's blocks that became full and computed since the last call.

        Returns the new ``(num_registered, last_hash)`` that the request keeps for the next call.
        """
        full = num_computed // self.block_size
        if not self.enabled or full <= num_registered:
            return num_registered, last_hash
        new_keys = block_keys(token_ids[: full * self.block_size], self.block_size, num_registered, last_hash)
        for i, key in enumerate(new_keys):
            self.pool.cache(block_ids[num_registered + i], key)
            last_hash = key.hash
        return full, last_hash
