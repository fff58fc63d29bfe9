"""ResponseStore: rows private to their owner, durable across reopening, deleted after the retention."""

from __future__ import annotations

from swiftlm.server.responses.store import ResponseStore, StoredResponse


def _record(rid: str, owner: str, created_at: int) -> StoredResponse:
    return StoredResponse(rid, owner, created_at, "resp_first", {"id": rid}, [{"type": "message"}],
                          [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])


def test_owner_durability_delete_and_retention(tmp_path) -> None:
    now = [1_000_000.0]
    store = ResponseStore(tmp_path, retention_s=3600, clock=lambda: now[0])
    store.put(_record("resp_a", "key-1", int(now[0])))
    assert store.get("key-2", "resp_a") is None  # another key's id reads as absent
    assert store.get("key-1", "resp_a") == _record("resp_a", "key-1", int(now[0]))
    assert not store.delete("key-2", "resp_a")
    store.close()
    store = ResponseStore(tmp_path, retention_s=3600, clock=lambda: now[0])  # reopened: still there
    assert store.get("key-1", "resp_a") is not None
    store.put(_record("resp_b", "key-1", int(now[0])))
    assert store.delete("key-1", "resp_b") and store.get("key-1", "resp_b") is None
    now[0] += 3601
    assert store.get("key-1", "resp_a") is None  # expired: not served even before the sweep
    assert store.sweep() == 1
    store.close()
