"""SessionPrefixRouter: Ray Serve's RequestRouter choosing replicas with ``swiftlm.cluster.routing``.

Built on Serve's own extension point (``ray.serve.request_router.RequestRouter`` with its
``FIFOMixin``), so Serve keeps doing what it does well: tracking the live replicas, their queue
lengths (its cache of them, probed when stale), backoff while every replica is full, and dropping a
replica whose actor died. This class only ranks the replicas for one request.

Ray's ``PrefixCacheAffinityRouter`` (``ray.serve.llm.request_router``) was not used: it keeps its
prefix tree in a separate Ray actor, reads the prompt from vLLM's request objects, and has no
session affinity. Here the ingress computes the key (``RoutingKey``) and passes it as the first
argument of the replica call, where ``choose_replicas`` reads it.

Ranking: a session's owner alone (its KV lives there; if it is full the request waits for it);
for any other request the chosen replica first, then the rest by queue length, so Serve can fall
back when the first is full. A request pinned to one replica (``RoutingKey.replica``, a debug
route) goes only there.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from swiftlm.cluster.routing import ReplicaChooser, RoundRobin, RoutingKey


class SessionPrefixRouter(FIFOMixin, RequestRouter):
    def initialize_state(self, max_imbalance: int = 4, virtual_nodes: int = 64, policy: str = "affinity",
                         **kwargs: Any) -> None:
        """``policy``: "affinity" (sessions and prefixes) or "round-robin" (the benchmark's baseline)."""
        self.round_robin = policy == "round-robin"
        self.chooser: ReplicaChooser | RoundRobin = (
            RoundRobin() if self.round_robin else ReplicaChooser(virtual_nodes=virtual_nodes, max_imbalance=max_imbalance)
        )

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        key = _routing_key(pending_request)
        if key.replica is not None:
            return [[by_id[key.replica]]] if key.replica in by_id else []
        loads = await self._queue_lengths(candidate_replicas)
        chosen = self.chooser.choose(key, loads)
        if key.session_id is not None and not self.round_robin:
            return [[by_id[chosen]]]
        rest = sorted((rid for rid in by_id if rid != chosen), key=lambda rid: loads[rid])
        return [[by_id[chosen]], [by_id[rid] for rid in rest]]

    async def _queue_lengths(self, replicas: list[RunningReplica]) -> dict[str, int]:
        """Each replica's requests in flight: Serve's cache, probed for the replicas it lacks."""
        lengths: dict[str, int] = {}
        stale: list[RunningReplica] = []
        for r in replicas:
            n = self._replica_queue_len_cache.get(r.replica_id)
            if n is None:
                stale.append(r)
            else:
                lengths[r.replica_id.unique_id] = n
        if stale:
            for r, n in await self._probe_queue_lens(stale, 0):
                lengths[r.replica_id.unique_id] = n if n is not None else 0
        return lengths


def _routing_key(pending_request: PendingRequest | None) -> RoutingKey:
    if pending_request is not None and pending_request.args and isinstance(pending_request.args[0], RoutingKey):
        return pending_request.args[0]
    return RoutingKey()
