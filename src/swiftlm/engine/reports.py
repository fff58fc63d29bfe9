"""What the engine reports about itself: counters for metrics (``EngineStats``) and where every KV
block is (``KvReport``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_sessions: int
    num_preemptions: int
    num_aborted: int
    num_failed_steps: int = 0
    num_failed_rows: int = 0
    healthy: bool = True
    # speculative decoding (zero without it): verified drafts, their tokens, those accepted (also
    # by position in the draft: [num_speculative_tokens])
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_position: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class KvReport:
    """Where every KV block is (``Engine.kv_report``): a block in use belongs to a live request or
    a session; ``error`` names the first broken invariant (None: the pool is consistent)."""

    blocks_usable: int
    blocks_free: int  # free or cached-but-evictable (reference count 0)
    blocks_in_sessions: int  # pinned between turns
    live_requests: int
    leaked_blocks: int  # in use, yet owned by no live request and no session
    error: str | None
