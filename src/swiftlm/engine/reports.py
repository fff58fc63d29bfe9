"""What the engine reports about itself: counters for metrics (``EngineStats``) and where every KV
block is (``KvReport``)."""

from __future__ import annotations

from dataclasses import dataclass

from swiftlm.cache.block_pool import NULL_BLOCK
from swiftlm.cache.kv_manager import KVCacheManager
from swiftlm.core.request import Request
from swiftlm.engine.scheduler import Scheduler
from swiftlm.engine.speculation import Speculator


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


def kv_report(kv: KVCacheManager, live: list[Request]) -> KvReport:
    """Check the pool's bookkeeping and account for every block: ``live`` are the engine's live
    sequences; a block in use that none of them nor a session owns is leaked."""
    error = None
    try:
        kv.check_integrity(live)
    except AssertionError as exc:
        error = str(exc) or "KV pool integrity check failed"
    pool = kv.pool
    pinned = {b for s in kv.sessions.all() for b in s.block_ids}
    owned = pinned | {b for r in live for b in r.block_ids}
    return KvReport(
        blocks_usable=pool.num_usable_blocks, blocks_free=pool.num_free_blocks,
        blocks_in_sessions=len(pinned), live_requests=len(live),
        leaked_blocks=pool.num_usable_blocks - pool.num_free_blocks - len(owned - {NULL_BLOCK}), error=error,
    )


def engine_stats(
    scheduler: Scheduler, kv: KVCacheManager, speculator: Speculator | None, *, num_aborted: int,
    num_failed_steps: int, num_failed_rows: int, healthy: bool,
) -> EngineStats:
    """The engine's counters now (``Engine.stats``), from its parts."""
    spec = speculator.stats if speculator is not None else None
    return EngineStats(
        num_running=len(scheduler.running), num_waiting=len(scheduler.waiting),
        kv_cache_usage=kv.usage, num_sessions=len(kv.sessions),
        prefix_cache_queries=kv.prefix_cache.queries, prefix_cache_hits=kv.prefix_cache.hits,
        num_preemptions=scheduler.num_preemptions,
        num_aborted=num_aborted,
        num_failed_steps=num_failed_steps,
        num_failed_rows=num_failed_rows,
        healthy=healthy,
        spec_num_drafts=spec.num_drafts if spec else 0,
        spec_num_draft_tokens=spec.num_draft_tokens if spec else 0,
        spec_num_accepted_tokens=spec.num_accepted_tokens if spec else 0,
        spec_accepted_per_position=tuple(spec.accepted_per_position) if spec else (),
    )
