"""JobLeases and the runner under them: replicas sharing one store never run the same job, and
take over a job whose holder died once its lease expires."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

from swiftlm.batch.leases import JobLeases
from swiftlm.batch.objects import LineResult
from swiftlm.batch.runner import BatchLimits, BatchRunner
from swiftlm.batch.store import BatchStore


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_one_holder_at_a_time_and_take_over_after_expiry(tmp_path: Path) -> None:
    BatchStore(tmp_path).close()  # the store's database
    clock = Clock()
    a, b = JobLeases(tmp_path, clock), JobLeases(tmp_path, clock)  # two processes' connections
    assert a.acquire("batch_1", "A", ttl_s=30)
    assert not b.acquire("batch_1", "B", ttl_s=30)
    assert a.acquire("batch_1", "A", ttl_s=30)  # the holder may take it again
    assert b.holder("batch_1") == "A"
    assert b.acquire("batch_2", "B", ttl_s=30)  # another job is free
    clock.now += 20
    assert a.renew("batch_1", "A", ttl_s=30)  # now expires at +50
    clock.now += 25
    assert not b.acquire("batch_1", "B", ttl_s=30)  # renewed: still A's
    clock.now += 10  # A stopped renewing: expired
    assert b.holder("batch_1") is None
    assert b.acquire("batch_1", "B", ttl_s=30)
    assert not a.renew("batch_1", "A", ttl_s=30)  # A learns it lost the job
    a.release("batch_1", "A")  # a stale holder's release changes nothing
    assert b.holder("batch_1") == "B"
    b.release("batch_1", "B")
    assert a.acquire("batch_1", "A", ttl_s=30)  # released: free at once
    a.close()
    b.close()


def _job(store: BatchStore, n: int) -> str:
    f = store.create_file("alice", "batch", "in.jsonl", b"{}\n")
    batch = store.create_batch("alice", f.id, "/v1/chat/completions", "24h", None)
    lines = [(i, f"req-{i}", "/v1/chat/completions", json.dumps({"i": i})) for i in range(n)]
    store.add_lines(batch.id, lines)
    store.set_status(batch.id, "in_progress")
    return batch.id


def _runner(root: Path, holder: str, calls: Counter, lease_s: float = 30.0) -> BatchRunner:
    async def call(url: str, body: dict, owner: str) -> tuple[int, dict]:
        calls[(holder, body["i"])] += 1
        await asyncio.sleep(0.002)
        return 200, {"i": body["i"]}

    store = BatchStore(root, sweep_orphans=False)
    return BatchRunner(store, call, BatchLimits(lease_s=lease_s), leases=JobLeases(root), holder=holder)


def test_two_runners_on_one_store_run_each_line_once(tmp_path: Path) -> None:
    with BatchStore(tmp_path) as store:
        batch_ids = [_job(store, 20) for _ in range(3)]
    calls: Counter = Counter()

    async def main() -> None:
        a, b = _runner(tmp_path, "A", calls), _runner(tmp_path, "B", calls)
        await asyncio.gather(a.start(), b.start())  # both find the 3 unfinished jobs
        for batch_id in batch_ids:
            await asyncio.gather(a.wait(batch_id), b.wait(batch_id))
        await asyncio.gather(a.close(), b.close())

    asyncio.run(main())
    per_line = Counter(i for (_, i) in calls.elements())
    assert sum(calls.values()) == 60  # 3 jobs x 20 lines, each asked exactly once
    assert set(per_line.values()) == {3}  # line i of each of the 3 jobs
    with BatchStore(tmp_path) as store:
        for batch_id in batch_ids:
            done = store.get_batch("alice", batch_id)
            assert done.status == "completed" and done.completed == 20


def test_a_job_whose_holder_died_is_taken_over(tmp_path: Path) -> None:
    with BatchStore(tmp_path) as store:
        batch_id = _job(store, 5)
        store.record_result(batch_id, LineResult(0, "req-0", 200, {"i": 0}, None))  # the dead holder's line 0
    dead = JobLeases(tmp_path)
    # it never renews; its lease outlasts the runner's start and first look (on a loaded machine too)
    acquired = time.monotonic()
    assert dead.acquire(batch_id, "dead", ttl_s=1.0)
    calls: Counter = Counter()

    async def main() -> None:
        runner = _runner(tmp_path, "B", calls, lease_s=0.3)
        await runner.start()
        await asyncio.sleep(0.05)
        assert time.monotonic() - acquired < 1.0, "the dead holder's lease expired before the first look"
        assert not calls, "ran a job another process holds"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the adopter looks every lease_s / 2
            await asyncio.sleep(0.05)
            if runner.store.get_batch("alice", batch_id).status == "completed":
                break
        await runner.close()

    asyncio.run(main())
    assert sorted(i for (_, i) in calls) == [1, 2, 3, 4]  # line 0 kept its result, the rest ran once
    with BatchStore(tmp_path) as store:
        assert store.get_batch("alice", batch_id).status == "completed"
    dead.close()
