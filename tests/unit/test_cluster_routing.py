"""swiftlm.cluster.routing: the consistent-hash ring, prefix keys, prefix affinity, least-loaded."""

from __future__ import annotations

import subprocess
import sys

import pytest

from swiftlm.cluster.routing import (
    HashRing,
    PrefixAffinity,
    ReplicaChooser,
    ReplicaSlots,
    RoundRobin,
    RoutingKey,
    conversation_text,
    prefix_keys,
    stable_hash,
)

KEYS = [f"session-{i}" for i in range(2000)]


def test_ring_spreads_keys_over_replicas() -> None:
    ring = HashRing(["a", "b", "c"], virtual_nodes=64)
    owners = [ring.owner(k) for k in KEYS]
    for replica in "abc":
        share = owners.count(replica) / len(KEYS)
        assert 0.2 < share < 0.47, (replica, share)


def test_adding_a_replica_moves_only_keys_to_it() -> None:
    ring = HashRing(["a", "b", "c"])
    before = {k: ring.owner(k) for k in KEYS}
    ring.add("d")
    after = {k: ring.owner(k) for k in KEYS}
    moved = {k for k in KEYS if before[k] != after[k]}
    assert moved, "the new replica took no keys"
    assert all(after[k] == "d" for k in moved)
    assert 0.1 < len(moved) / len(KEYS) < 0.4


def test_removing_a_replica_moves_only_its_keys() -> None:
    ring = HashRing(["a", "b", "c"])
    before = {k: ring.owner(k) for k in KEYS}
    ring.remove("b")
    after = {k: ring.owner(k) for k in KEYS}
    for k in KEYS:
        if before[k] != "b":
            assert after[k] == before[k], k
        else:
            assert after[k] in ("a", "c")
    ring.add("b")  # back in the same place: every key returns to its first owner
    assert {k: ring.owner(k) for k in KEYS} == before


def test_ring_is_the_same_in_another_process() -> None:
    ring = HashRing(["a", "b"])
    code = ("from swiftlm.cluster.routing import HashRing; r = HashRing(['a', 'b']); "
            "print(','.join(r.owner(f'session-{i}') for i in range(50)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ",".join(ring.owner(f"session-{i}") for i in range(50))
    assert stable_hash("x") != stable_hash("y")


def test_empty_ring_and_bad_sizes() -> None:
    with pytest.raises(LookupError):
        HashRing().owner("k")
    with pytest.raises(ValueError):
        HashRing(virtual_nodes=0)


def test_prefix_keys_are_shared_exactly_as_far_as_the_text() -> None:
    system = "s" * 600
    a, b = prefix_keys(system + "question one", 256), prefix_keys(system + "another question", 256)
    # chunks [0,256) and [256,512) are all system prompt; [512,768) holds where they differ
    assert a[:2] == b[:2]
    assert a[2] != b[2]
    assert len(prefix_keys("x" * 10, 256)) == 1
    assert prefix_keys("", 256) == ()
    assert len(prefix_keys("x" * 100_000, 256, max_chunks=16)) == 16


def test_conversation_text_and_routing_key() -> None:
    body = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    text = conversation_text(body)
    assert text.startswith("<system>be brief\n<user>")
    assert "hi" in text
    assert conversation_text({"prompt": "abc"}) == "abc"
    assert RoutingKey.of({**body, "session_id": "s1"}, None) == RoutingKey(session_id="s1")
    assert RoutingKey.of(body, "s2") == RoutingKey(session_id="s2")  # the header, when the body has none
    assert RoutingKey.of({**body, "session_id": "s1"}, "s2").session_id == "s1"
    assert RoutingKey.of(body, None).prefix == prefix_keys(text)
    assert RoutingKey.of(None, None) == RoutingKey()


def test_affinity_finds_the_longest_known_prefix() -> None:
    table = PrefixAffinity()
    table.record(("k1", "k2"), "a")
    table.record(("k1", "k2", "k3"), "b")
    assert table.owner(("k1", "k2", "k3", "k4"), {"a", "b"}) == ("b", 3)
    assert table.owner(("k1", "k9"), {"a", "b"}) == ("b", 1)  # b served k1 last
    assert table.owner(("k1", "k2", "k3"), {"a"}) == (None, 0)  # b is gone
    table.forget("b")
    assert table.owner(("k1",), {"a", "b"}) == (None, 0)
    small = PrefixAffinity(capacity=2)
    small.record(("x", "y", "z"), "a")
    assert small.owner(("x",), {"a"}) == (None, 0)  # evicted (least recently used)
    assert small.owner(("x", "y", "z"), {"a"}) == ("a", 3)


def test_sessions_stay_on_their_replica_whatever_the_load() -> None:
    chooser = ReplicaChooser()
    loads = {"r1": 0, "r2": 0}
    owners = {s: chooser.choose(RoutingKey(session_id=s), loads) for s in KEYS[:200]}
    assert set(owners.values()) == {"r1", "r2"}
    busy = {"r1": 50, "r2": 0}
    assert all(chooser.choose(RoutingKey(session_id=s), busy) == r for s, r in owners.items())


def test_prefix_affinity_until_the_imbalance_threshold() -> None:
    chooser = ReplicaChooser(max_imbalance=4)
    key = RoutingKey(prefix=prefix_keys("system prompt " * 100))
    first = chooser.choose(key, {"r1": 0, "r2": 0})
    other = "r2" if first == "r1" else "r1"
    assert chooser.choose(key, {first: 4, other: 0}) == first  # 4 more is still within the threshold
    assert chooser.choose(key, {first: 5, other: 0}) == other  # 5 more: the least-loaded gets it
    assert chooser.choose(key, {first: 0, other: 0}) == other  # ... and owns the prefix now


def test_least_loaded_fallback() -> None:
    chooser = ReplicaChooser()
    assert chooser.choose(RoutingKey(), {"r1": 3, "r2": 1, "r3": 2}) == "r2"
    picks = {chooser.choose(RoutingKey(prefix=prefix_keys(f"q{i}")), {"r1": 0, "r2": 0}) for i in range(40)}
    assert picks == {"r1", "r2"}  # equal loads: new prefixes spread over the tied replicas
    with pytest.raises(LookupError):
        chooser.choose(RoutingKey(), {})


def test_a_replacement_replica_takes_the_dead_ones_place() -> None:
    slots = ReplicaSlots()
    assert slots.update(["x", "y"]) == {"x": "slot-0", "y": "slot-1"}
    assert slots.update(["y"]) == {"y": "slot-1"}
    assert slots.update(["y", "z"]) == {"y": "slot-1", "z": "slot-0"}
    chooser = ReplicaChooser()
    loads = {"x": 0, "y": 0}
    owners = {s: chooser.choose(RoutingKey(session_id=s), loads) for s in KEYS[:300]}
    survivors = {s for s, r in owners.items() if r == "y"}
    after_death = {s: chooser.choose(RoutingKey(session_id=s), {"y": 0}) for s in owners}
    assert set(after_death.values()) == {"y"}
    replaced = {s: chooser.choose(RoutingKey(session_id=s), {"y": 0, "z": 0}) for s in owners}
    assert all(replaced[s] == "y" for s in survivors)  # y's sessions never moved
    assert all(replaced[s] == "z" for s in owners if s not in survivors)  # x's went to its replacement


def test_round_robin_ignores_keys() -> None:
    rr = RoundRobin()
    loads = {"r2": 9, "r1": 0}
    assert [rr.choose(RoutingKey(session_id="s"), loads) for _ in range(4)] == ["r1", "r2", "r1", "r2"]
