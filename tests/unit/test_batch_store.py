"""BatchStore: files, batch lifecycle, exactly-once results, crash recovery, finalize, retention."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import openai.types
import pytest

from swiftlm.batch.objects import (
    BatchRecord,
    FileRecord,
    LineResult,
    error_line,
    output_line,
)
from swiftlm.batch.store import BatchStore


class Clock:
    """A settable clock, so created_at values and retention cutoffs are exact."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, clock: Clock):
    with BatchStore(tmp_path, clock=clock) as s:
        yield s


def _lines(n: int) -> list[tuple[int, str, str, str]]:
    return [(i, f"req-{i}", "/v1/chat/completions", json.dumps({"model": "m", "messages": [], "i": i}))
            for i in range(n)]


def _batch_with_lines(store: BatchStore, owner: str = "alice", n: int = 3) -> BatchRecord:
    f = store.create_file(owner, "batch", "in.jsonl", b"{}\n")
    b = store.create_batch(owner, f.id, "/v1/chat/completions", "24h", {"k": "v"})
    store.add_lines(b.id, _lines(n))
    return b


def _ok(i: int) -> LineResult:
    return LineResult(i, f"req-{i}", 200, {"id": f"chatcmpl-{i}", "object": "chat.completion"}, None)


def _bad(i: int) -> LineResult:
    return LineResult(i, f"req-{i}", 400, {"error": {"message": "bad", "type": "invalid_request_error"}}, None)


def _tmp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(".tmp-")]


def test_file_crud_and_privacy(store: BatchStore, clock: Clock) -> None:
    a = store.create_file("alice", "batch", "a.jsonl", b"hello")
    clock.now += 1
    b = store.create_file("alice", "batch", "b.jsonl", b"world!")
    c = store.create_file("bob", "batch", "c.jsonl", b"bob's")
    assert a.id.startswith("file-") and len(a.id) == len("file-") + 24
    assert a.bytes == 5 and a.created_at == 1_700_000_000
    assert store.get_file("alice", a.id) == a
    assert store.get_file("bob", a.id) is None
    assert store.read_file("alice", b.id) == b"world!"
    assert store.read_file("bob", b.id) is None and store.file_path("bob", b.id) is None
    assert store.file_path("alice", a.id) == store.files_dir / a.id
    assert [f.id for f in store.list_files("alice")] == [b.id, a.id]
    assert [f.id for f in store.list_files("alice", order="asc")] == [a.id, b.id]
    assert [f.id for f in store.list_files("alice", after=b.id)] == [a.id]
    assert [f.id for f in store.list_files("alice", limit=1)] == [b.id]
    assert store.list_files("alice", purpose="batch_output") == []
    assert store.list_files("alice", after=c.id) == []  # another owner's id is no cursor
    assert not store.delete_file("bob", a.id)
    assert store.delete_file("alice", a.id)
    assert not store.delete_file("alice", a.id)
    assert store.get_file("alice", a.id) is None and not (store.files_dir / a.id).exists()
    with pytest.raises(ValueError, match="order"):
        store.list_files("alice", order="sideways")


def test_batch_lifecycle(store: BatchStore, clock: Clock) -> None:
    b = _batch_with_lines(store, n=2)
    assert b.status == "validating" and b.expires_at == b.created_at + 86400
    assert b.id.startswith("batch_") and len(b.id) == len("batch_") + 24
    assert store.get_batch("bob", b.id) is None
    assert store.get_batch("alice", b.id).total == 2
    clock.now += 5
    running = store.set_status(b.id, "in_progress")
    assert running.status == "in_progress" and running.in_progress_at == b.created_at + 5
    assert store.set_status(b.id, "finalizing", finalizing_at=123).finalizing_at == 123
    done = store.set_status(b.id, "failed", errors=[{"code": "x", "message": "y", "line": None}])
    assert done.status == "failed" and done.errors == [{"code": "x", "message": "y", "line": None}]
    assert store.set_status(b.id, "in_progress") is None  # terminal is final
    assert store.get_batch("alice", b.id).status == "failed"
    with pytest.raises(ValueError, match="unknown batch status"):
        store.set_status(b.id, "done")
    with pytest.raises(ValueError, match="cannot set"):
        store.set_status(b.id, "completed", total=9)
    with pytest.raises(ValueError, match="upload the input file"):
        store.create_batch("bob", b.input_file_id, "/v1/chat/completions", "24h", None)


def test_request_cancel(store: BatchStore, clock: Clock) -> None:
    b = _batch_with_lines(store)
    assert store.request_cancel("bob", b.id) is None
    clock.now += 7
    cancelling = store.request_cancel("alice", b.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at == b.created_at + 7
    store.set_status(b.id, "cancelled")
    assert store.request_cancel("alice", b.id).status == "cancelled"


def test_list_batches_pagination(store: BatchStore, clock: Clock) -> None:
    f = store.create_file("alice", "batch", "in.jsonl", b"{}\n")
    ids = []
    for i in range(5):
        clock.now += i % 2  # some share a second: ties break by creation order
        ids.append(store.create_batch("alice", f.id, "/v1/embeddings", "24h", None).id)
    store.create_batch("bob", store.create_file("bob", "batch", "x", b"").id, "/v1/embeddings", "24h", None)
    newest_first = ids[::-1]
    page, more = store.list_batches("alice", None, 2)
    assert [b.id for b in page] == newest_first[:2] and more
    page, more = store.list_batches("alice", page[-1].id, 2)
    assert [b.id for b in page] == newest_first[2:4] and more
    page, more = store.list_batches("alice", page[-1].id, 2)
    assert [b.id for b in page] == newest_first[4:] and not more
    assert store.list_batches("alice", "batch_nope", 2) == ([], False)


def test_record_result_exactly_once(store: BatchStore) -> None:
    b = _batch_with_lines(store, n=3)
    assert store.record_result(b.id, _ok(0))
    assert store.record_result(b.id, _bad(1))
    assert not store.record_result(b.id, _bad(0))  # a second result for line 0 is refused
    got = store.get_batch("alice", b.id)
    assert (got.total, got.completed, got.failed) == (3, 1, 1)
    assert store.results(b.id) == [_ok(0), _bad(1)]
    assert [line[0] for line in store.pending_lines(b.id)] == [2]
    with pytest.raises(KeyError):
        store.record_result(b.id, _ok(9))


def test_record_result_concurrent_threads(store: BatchStore) -> None:
    b = _batch_with_lines(store, n=1)
    outcomes: list[bool] = []
    threads = [threading.Thread(target=lambda: outcomes.append(store.record_result(b.id, _ok(0))))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == [False] * 7 + [True]
    assert store.get_batch("alice", b.id).completed == 1


def test_add_lines_idempotent(store: BatchStore) -> None:
    b = _batch_with_lines(store, n=3)
    assert store.add_lines(b.id, _lines(4)) == 1
    assert store.get_batch("alice", b.id).total == 4
    assert store.pending_lines(b.id) == _lines(4)


def test_reopen_after_crash_sees_pending_work(tmp_path: Path, clock: Clock) -> None:
    first = BatchStore(tmp_path, clock=clock)
    b = _batch_with_lines(first, n=3)
    first.set_status(b.id, "in_progress")
    first.record_result(b.id, _ok(1))
    done = _batch_with_lines(first, owner="bob", n=1)
    first.set_status(done.id, "completed")
    first.close()  # the process dies here, without finalizing

    with BatchStore(tmp_path, clock=clock) as second:
        assert [u.id for u in second.unfinished_batches()] == [b.id]
        assert [line[0] for line in second.pending_lines(b.id)] == [0, 2]
        assert second.get_batch("alice", b.id).completed == 1
        assert not second.record_result(b.id, _ok(1))


def test_reopen_sweeps_orphan_content(tmp_path: Path) -> None:
    with BatchStore(tmp_path) as s:
        kept = s.create_file("alice", "batch", "a", b"a")
    (tmp_path / "files" / "file-orphan").write_bytes(b"no row")
    (tmp_path / "files" / ".tmp-file-x.1234").write_bytes(b"half")
    with BatchStore(tmp_path) as s:
        assert sorted(p.name for p in s.files_dir.iterdir()) == [kept.id]


def test_finalize_twice_same_files_no_duplicates(store: BatchStore) -> None:
    b = _batch_with_lines(store, n=3)
    store.record_result(b.id, _ok(0))
    store.record_result(b.id, _bad(1))
    store.record_result(b.id, LineResult(2, "req-2", None, None, {"code": "batch_expired", "message": "late"}))
    first = store.finalize(b.id)
    out, err = store.read_file("alice", first.output_file_id), store.read_file("alice", first.error_file_id)
    second = store.finalize(b.id)
    assert (second.output_file_id, second.error_file_id) == (first.output_file_id, first.error_file_id)
    assert store.read_file("alice", second.output_file_id) == out
    assert store.read_file("alice", second.error_file_id) == err
    assert len(out.splitlines()) == 1 and len(err.splitlines()) == 2
    outputs = store.list_files("alice", purpose="batch_output")
    assert sorted(f.filename for f in outputs) == [f"{b.id}_error.jsonl", f"{b.id}_output.jsonl"]
    assert store.get_file("alice", first.output_file_id).bytes == len(out)
    assert store.read_file("bob", first.output_file_id) is None
    assert _tmp_files(store.root) == []


def test_finalize_leaves_empty_side_null(store: BatchStore) -> None:
    b = _batch_with_lines(store, n=2)
    store.record_result(b.id, _ok(0))
    store.record_result(b.id, _ok(1))
    done = store.finalize(b.id)
    assert done.output_file_id is not None and done.error_file_id is None


def test_output_and_error_line_shapes() -> None:
    ok = json.loads(output_line("batch_x", _ok(0)))
    assert ok["id"].startswith("batch_req_") and ok["custom_id"] == "req-0" and ok["error"] is None
    assert ok["response"]["status_code"] == 200 and ok["response"]["request_id"].startswith("req_")
    assert ok["response"]["body"] == {"id": "chatcmpl-0", "object": "chat.completion"}
    assert output_line("batch_x", _ok(0)) == output_line("batch_x", _ok(0))  # deterministic ids

    http_error = json.loads(error_line("batch_x", _bad(1)))
    assert http_error["response"]["status_code"] == 400 and http_error["error"] is None

    never_ran = json.loads(error_line("batch_x", LineResult(2, "c", None, None, {"code": "e", "message": "m"})))
    assert never_ran["response"] is None and never_ran["error"] == {"code": "e", "message": "m"}
    assert set(never_ran) == {"id", "custom_id", "response", "error"}
    with pytest.raises(ValueError):
        output_line("batch_x", _bad(1))
    with pytest.raises(ValueError):
        error_line("batch_x", _ok(0))


def test_openai_models_accept_objects(store: BatchStore) -> None:
    b = _batch_with_lines(store, n=2)
    store.record_result(b.id, _ok(0))
    store.record_result(b.id, _bad(1))
    store.finalize(b.id)
    store.set_status(b.id, "failed", errors=[{"code": "c", "message": "m", "line": 3}])
    obj = store.get_batch("alice", b.id).to_openai()
    batch = openai.types.Batch.model_validate(obj)
    assert batch.request_counts.total == 2 and batch.request_counts.failed == 1
    assert batch.errors.data[0].line == 3 and batch.metadata == {"k": "v"}
    assert set(obj) == set(openai.types.Batch.model_fields) - {"model", "usage"}
    fresh = openai.types.Batch.model_validate(_batch_with_lines(store).to_openai())
    assert fresh.errors is None and fresh.status == "validating"
    for f in store.list_files("alice"):
        record = openai.types.FileObject.model_validate(f.to_openai())
        assert record.id == f.id and record.object == "file"
    assert set(FileRecord("file-1", "o", "batch", "n", 1, 2).to_openai()) == set(openai.types.FileObject.model_fields)


def test_retention(store: BatchStore, clock: Clock) -> None:
    old = _batch_with_lines(store, n=1)
    store.record_result(old.id, _ok(0))
    old = store.finalize(old.id)
    store.set_status(old.id, "completed")
    old_running = _batch_with_lines(store, n=1)
    stray = store.create_file("alice", "batch", "stray.jsonl", b"x")
    clock.now += 100
    shared_input = store.create_file("alice", "batch", "new.jsonl", b"{}\n")
    young = store.create_batch("alice", shared_input.id, "/v1/embeddings", "24h", None)
    store.set_status(young.id, "completed")

    assert store.delete_older_than(clock.now - 50) == 1
    assert store.get_batch("alice", old.id) is None
    assert store.pending_lines(old.id) == [] and store.results(old.id) == []
    for fid in (old.output_file_id, old.input_file_id, stray.id):
        assert store.get_file("alice", fid) is None and not (store.files_dir / fid).exists()
    assert store.get_batch("alice", old_running.id) is not None  # not terminal: kept
    assert store.get_file("alice", old_running.input_file_id) is not None  # still referenced
    assert store.get_batch("alice", young.id) is not None and store.get_file("alice", shared_input.id)
    assert store.delete_older_than(clock.now - 50) == 0


def test_atomic_writes_leave_no_temp_files(store: BatchStore) -> None:
    for i in range(3):
        store.create_file("alice", "batch", f"{i}.jsonl", b"x" * 1000)
    b = _batch_with_lines(store, n=1)
    store.record_result(b.id, _ok(0))
    store.finalize(b.id)
    assert _tmp_files(store.root) == []
    names = {p.name for p in store.files_dir.iterdir()}
    assert names == {f.id for f in store.list_files("alice")}
