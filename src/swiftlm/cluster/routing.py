"""Which replica serves a request: session affinity, prefix affinity, least-loaded fallback.

Pure logic (no Ray): the Serve router (``swiftlm.cluster.router``) asks ``ReplicaChooser`` with
the request's routing key and the replicas' queue lengths; tests drive it directly.

- A request with a session id goes to the replica that owns the id on a consistent-hash ring
  (``HashRing``). Each replica sits on the ring at ``virtual_nodes`` points; a key belongs to the
  first point clockwise from its hash. Adding or removing a replica moves only the keys of the
  points it adds or removes: every other session stays where its KV is.
- A request without one carries a prefix key chain (``prefix_keys``): chained hashes of the
  first ``chunk_chars``-sized chunks of its conversation text (the system prompt and the first
  messages come first, so requests sharing a long system prompt share the leading keys). The
  replica that last served the longest known part of the chain gets the request, unless its
  queue is longer than the least-loaded replica's by more than ``max_imbalance``; then the
  least-loaded replica does, and becomes the prefix's new owner.
- Without either, or when nothing of the prefix is known: the least-loaded replica (ties broken
  by the ring, so equal loads do not always pick the same replica).

Hashes are blake2b, not ``hash()``: every process (ingress, router, tests) must agree.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def stable_hash(text: str) -> int:
    """A 64-bit hash that is the same in every process and every run."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class HashRing:
    """A consistent-hash ring of replica names, ``virtual_nodes`` points each."""

    def __init__(self, replicas: Iterable[str] = (), virtual_nodes: int = 64) -> None:
        if virtual_nodes < 1:
            raise ValueError(f"virtual_nodes must be at least 1, got {virtual_nodes}")
        self.virtual_nodes = virtual_nodes
        self._points: list[int] = []  # sorted hashes of every (replica, i) point
        self._owner: dict[int, str] = {}
        self._replicas: set[str] = set()
        for replica in replicas:
            self.add(replica)

    @property
    def replicas(self) -> frozenset[str]:
        return frozenset(self._replicas)

    def add(self, replica: str) -> None:
        if replica in self._replicas:
            return
        self._replicas.add(replica)
        for i in range(self.virtual_nodes):
            point = stable_hash(f"{replica}#{i}")
            if point in self._owner:  # a 64-bit collision: the first replica keeps the point
                continue
            self._owner[point] = replica
            bisect.insort(self._points, point)

    def remove(self, replica: str) -> None:
        if replica not in self._replicas:
            return
        self._replicas.discard(replica)
        mine = {p for p, r in self._owner.items() if r == replica}
        self._points = [p for p in self._points if p not in mine]
        for p in mine:
            del self._owner[p]

    def owner(self, key: str) -> str:
        """The replica that owns ``key``: the first point at or after the key's hash, wrapping."""
        if not self._points:
            raise LookupError("the ring has no replicas")
        i = bisect.bisect_left(self._points, stable_hash(key))
        return self._owner[self._points[i % len(self._points)]]


def conversation_text(body: Mapping[str, Any]) -> str:
    """The text a request's prompt starts with, in prompt order: chat messages (role and content,
    system first as sent) or the completion prompt. Not the rendered template: the ingress has no
    tokenizer, and the same messages always render the same prompt, so equal text means an equal
    token prefix."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for m in messages:
            if isinstance(m, Mapping):
                content = m.get("content")
                text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
                parts.append(f"<{m.get('role')}>{text}")
        return "\n".join(parts)
    prompt = body.get("prompt", body.get("input"))
    if isinstance(prompt, str):
        return prompt
    return "" if prompt is None else json.dumps(prompt)


def prefix_keys(text: str, chunk_chars: int = 256, max_chunks: int = 16) -> tuple[str, ...]:
    """Chained hashes of ``text``'s leading chunks: key i covers characters [0, (i+1)*chunk_chars),
    so two texts share key i exactly when they share those characters (up to hash collisions).
    A partial last chunk gets a key too; at most ``max_chunks`` keys (the first
    ``chunk_chars * max_chunks`` characters decide)."""
    keys: list[str] = []
    parent = ""
    for start in range(0, min(len(text), chunk_chars * max_chunks), chunk_chars):
        parent = format(stable_hash(parent + text[start:start + chunk_chars]), "016x")
        keys.append(parent)
    return tuple(keys)


@dataclass(frozen=True, slots=True)
class RoutingKey:
    """What the ingress learned from a request for the router: a session id, else a prefix chain.
    ``replica``: a replica id the request must reach (the ingress's debug route), else None."""

    session_id: str | None = None
    prefix: tuple[str, ...] = ()
    replica: str | None = None

    @classmethod
    def of(cls, body: Mapping[str, Any] | None, session_header: str | None, chunk_chars: int = 256) -> RoutingKey:
        body = body or {}
        session = body.get("session_id")
        if not isinstance(session, str) or not session:
            session = session_header or None
        if session is not None:
            return cls(session_id=session)
        return cls(prefix=prefix_keys(conversation_text(body), chunk_chars))


class PrefixAffinity:
    """The replica that last served each prefix key (an LRU table of at most ``capacity`` keys)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._owner: OrderedDict[str, str] = OrderedDict()

    def owner(self, keys: Sequence[str], alive: Iterable[str]) -> tuple[str | None, int]:
        """The live replica holding the longest known part of ``keys``, and how many keys it holds."""
        alive = set(alive)
        for depth in range(len(keys), 0, -1):
            replica = self._owner.get(keys[depth - 1])
            if replica is not None and replica in alive:
                return replica, depth
        return None, 0

    def record(self, keys: Sequence[str], replica: str) -> None:
        for key in keys:
            self._owner[key] = replica
            self._owner.move_to_end(key)
        while len(self._owner) > self.capacity:
            self._owner.popitem(last=False)

    def forget(self, replica: str) -> None:
        for key in [k for k, r in self._owner.items() if r == replica]:
            del self._owner[key]


class ReplicaSlots:
    """Stable ring names for replicas whose ids change when they are replaced.

    A replica that dies comes back with a new id. Ringing the ids would let the new one take
    points from every survivor; instead each live replica holds a slot (``slot-0``, ``slot-1``,
    ...) and a newcomer takes the lowest free one, i.e. the dead replica's place on the ring: only
    the dead replica's sessions move, and they move to the replacement."""

    def __init__(self) -> None:
        self._slot: dict[str, int] = {}

    def update(self, replica_ids: Iterable[str]) -> dict[str, str]:
        """Assign slots for the current replicas (sorted ids take free slots in order); returns
        replica id -> ring name."""
        current = set(replica_ids)
        for gone in set(self._slot) - current:
            del self._slot[gone]
        for new in sorted(current - set(self._slot)):
            taken = set(self._slot.values())
            self._slot[new] = next(i for i in range(len(self._slot) + 1) if i not in taken)
        return {rid: f"slot-{slot}" for rid, slot in self._slot.items()}


class RoundRobin:
    """The baseline the benchmark compares affinity with: replicas in turn, keys ignored."""

    def __init__(self) -> None:
        self._next = 0

    def choose(self, key: RoutingKey, queue_lengths: Mapping[str, int]) -> str:
        if not queue_lengths:
            raise LookupError("no live replicas")
        ids = sorted(queue_lengths)
        self._next += 1
        return ids[(self._next - 1) % len(ids)]


ROUTING_POLICIES = ("affinity", "round-robin")


class ReplicaChooser:
    """``choose(key, queue_lengths)`` -> replica id; ``queue_lengths`` names the live replicas.

    ``max_imbalance``: how many more queued requests than the least-loaded replica a prefix's
    owner may have and still get it (sessions are never moved for load: their KV is worth more)."""

    def __init__(self, virtual_nodes: int = 64, max_imbalance: int = 4, prefix_capacity: int = 100_000) -> None:
        self.max_imbalance = max_imbalance
        self._slots = ReplicaSlots()
        self._ring = HashRing(virtual_nodes=virtual_nodes)
        self._names: dict[str, str] = {}  # replica id -> ring name
        self._ids: dict[str, str] = {}  # ring name -> replica id
        self.prefixes = PrefixAffinity(prefix_capacity)

    def sync(self, replica_ids: Iterable[str]) -> None:
        """Follow the live replica set: the ring keeps its slots, the dead lose their prefixes."""
        names = self._slots.update(replica_ids)
        for rid in set(self._names) - set(names):
            self._ring.remove(self._names[rid])
            self.prefixes.forget(rid)
        for rid, name in names.items():
            if self._names.get(rid) != name:
                self._ring.add(name)
        self._names = names
        self._ids = {name: rid for rid, name in names.items()}

    def session_owner(self, session_id: str) -> str:
        return self._ids[self._ring.owner(f"session:{session_id}")]

    def choose(self, key: RoutingKey, queue_lengths: Mapping[str, int]) -> str:
        if not queue_lengths:
            raise LookupError("no live replicas")
        self.sync(queue_lengths)
        if key.session_id is not None:
            return self.session_owner(key.session_id)
        least = self.least_loaded(queue_lengths, key.prefix[0] if key.prefix else None)
        owner, _ = self.prefixes.owner(key.prefix, queue_lengths)
        chosen = least
        if owner is not None and queue_lengths[owner] - queue_lengths[least] <= self.max_imbalance:
            chosen = owner
        if key.prefix:
            self.prefixes.record(key.prefix, chosen)
        return chosen

    def least_loaded(self, queue_lengths: Mapping[str, int], tie_key: str | None = None) -> str:
        """The replica with the shortest queue; among equals, the one ``tie_key`` falls to on the
        ring of the tied replicas (the first in id order without a key)."""
        shortest = min(queue_lengths.values())
        tied = sorted(rid for rid, n in queue_lengths.items() if n == shortest)
        if len(tied) == 1 or tie_key is None:
            return tied[0]
        ring = HashRing((self._names.get(rid, rid) for rid in tied), self._ring.virtual_nodes)
        name = ring.owner(f"prefix:{tie_key}")
        return self._ids.get(name, name)
