"""BatchRunner: runs Batch API jobs from a ``BatchStore``, line by line, so that a crash loses
nothing and repeats nothing.

A job's life: ``validating`` (the input file is read, every line gets a row keyed by the job and
its index; lines that cannot run get their error now) -> ``in_progress`` (each line without a
result runs through ``call``; its result is recorded once, keyed by job and line) ->
``finalizing`` (the output and error files are written) -> ``completed`` (or ``cancelled`` /
``expired`` / ``failed``). Every step is idempotent: after a crash ``start`` picks each
unfinished job up where its rows say it was; a line that was running when the process died has
no result row and runs again, and a line with a result never runs twice.

The runner does not know the engine: ``call(url, body, owner)`` executes one request (the server
passes its own endpoints, in process, at background priority) and returns the HTTP status and
the response body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from swiftlm.batch.leases import JobLeases
from swiftlm.batch.lines import LineCheck, check_lines
from swiftlm.batch.objects import BatchRecord, LineResult
from swiftlm.batch.store import BatchStore

log = logging.getLogger("swiftlm.batch")

_RETRY_STATUSES = frozenset({429, 503})
LineCall = Callable[[str, dict, str], Awaitable[tuple[int, dict]]]  # (url, body, owner) -> (status, body)


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """How much the runner takes on at once, and how long jobs are kept."""

    max_concurrent_lines: int = 64  # lines handed to the engine at once, over all jobs
    max_lines: int = 50_000  # lines in one input file (OpenAI's limit)
    retention_s: float | None = 7 * 24 * 3600.0  # finished jobs older than this are deleted
    retention_check_s: float = 600.0
    retry_delay_s: float = 0.5  # a line answered 503 / 429 is asked again after this
    lease_s: float = 30.0  # with a shared store: a job's lease, renewed every third of it (swiftlm.batch.leases)


@dataclass(slots=True)
class BatchCounts:
    """Lines over all jobs, for the metrics: waiting for a seat, running, finished (this process)."""

    queued: int = 0
    running: int = 0
    done: int = 0


@dataclass(slots=True)
class _Job:
    task: asyncio.Task | None = None
    cancel: asyncio.Event = field(default_factory=asyncio.Event)


class BatchRunner:
    """``leases``: when several processes share ``store`` (replicas), a job runs only in the one
    holding its lease, as ``holder``; they also take over the jobs whose holder stopped renewing."""

    def __init__(self, store: BatchStore, call: LineCall, limits: BatchLimits = BatchLimits(),
                 clock: Callable[[], float] = time.time, leases: JobLeases | None = None, holder: str = "") -> None:
        self.store = store
        self.limits = limits
        self.counts = BatchCounts()
        self._call = call
        self._clock = clock
        self._jobs: dict[str, _Job] = {}
        self._seats: asyncio.Semaphore | None = None
        self._retention: asyncio.Task | None = None
        self._leases = leases
        self._holder = holder
        self._adopter: asyncio.Task | None = None

    async def start(self) -> int:
        """Resume every unfinished job (after a restart) and start retention; returns how many
        jobs were resumed. Call from the event loop the jobs will run on."""
        self._seats = asyncio.Semaphore(self.limits.max_concurrent_lines)
        unfinished = self.store.unfinished_batches()
        for batch in unfinished:
            self.launch(batch)
        if self.limits.retention_s is not None:
            self._retention = asyncio.create_task(self._retain())
        if self._leases is not None:
            self._adopter = asyncio.create_task(self._adopt())
        if unfinished:
            log.info("resumed %d unfinished batch job(s)", len(unfinished))
        return len(unfinished)

    def launch(self, batch: BatchRecord) -> None:
        """Run ``batch`` (just created, or resumed) in the background."""
        job = self._jobs.setdefault(batch.id, _Job())
        if batch.status == "cancelling":
            job.cancel.set()
        if job.task is None or job.task.done():
            job.task = asyncio.create_task(self._run(batch.id, batch.owner))

    def cancel(self, owner: str, batch_id: str) -> BatchRecord | None:
        """Ask a job to stop: its running lines are aborted, the results it has are kept."""
        batch = self.store.request_cancel(owner, batch_id)
        if batch is not None and batch.status == "cancelling":
            self.launch(batch)  # sets the job's cancel event (and runs it, if it was not running)
        return batch

    async def wait(self, batch_id: str) -> None:
        """Until the job's task ends (tests and the offline CLI)."""
        job = self._jobs.get(batch_id)
        if job is not None and job.task is not None:
            await asyncio.shield(job.task)

    async def close(self) -> None:
        """Stop every job where it is, recording nothing more: they resume on the next start."""
        tasks = [j.task for j in self._jobs.values() if j.task is not None]
        tasks += [t for t in (self._retention, self._adopter) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _run(self, batch_id: str, owner: str) -> None:
        if self._leases is None:
            await self._run_job(batch_id, owner)
            return
        if not self._leases.acquire(batch_id, self._holder, self.limits.lease_s):
            return  # another process runs it
        job = asyncio.ensure_future(self._run_job(batch_id, owner))
        try:
            while not job.done():
                await asyncio.wait({job}, timeout=self.limits.lease_s / 3)
                if not job.done() and not self._leases.renew(batch_id, self._holder, self.limits.lease_s):
                    log.warning("batch %s: the lease was taken over; stopping here", batch_id)
                    job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job
        finally:
            job.cancel()
            self._leases.release(batch_id, self._holder)

    async def _adopt(self) -> None:
        """Pick up unfinished jobs that no live process holds (their holder died)."""
        assert self._leases is not None
        while True:
            await asyncio.sleep(self.limits.lease_s / 2)
            for batch in self.store.unfinished_batches():
                job = self._jobs.get(batch.id)
                if (job is None or job.task is None or job.task.done()) and self._leases.holder(batch.id) is None:
                    self.launch(batch)

    async def _run_job(self, batch_id: str, owner: str) -> None:
        try:
            batch = self.store.get_batch(owner, batch_id)
            if batch is None:
                return
            if batch.status == "validating" and not self._validate(batch):
                return
            await self._run_lines(batch_id, owner)
            self._finish(batch_id, owner)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug or a storage failure: the job fails, the server stays up
            log.exception("batch %s failed", batch_id)
            self.store.set_status(batch_id, "failed", failed_at=int(self._clock()),
                                  errors=[{"code": "internal_error", "message": str(exc), "line": None}])

    def _validate(self, batch: BatchRecord) -> bool:
        """Read the input file into line rows; lines that cannot run get their error result."""
        data = self.store.read_file(batch.owner, batch.input_file_id)
        if data is None:
            return self._fail(batch, "input_file_missing", f"the input file {batch.input_file_id} no longer exists")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return self._fail(batch, "invalid_file", "the input file is not UTF-8 text")
        checked = check_lines(text, batch.endpoint)
        if not checked:
            return self._fail(batch, "empty_file", "the input file has no request lines")
        if len(checked) > self.limits.max_lines:
            return self._fail(batch, "too_many_lines",
                              f"the input file has {len(checked)} lines; at most {self.limits.max_lines} are allowed")
        self.store.add_lines(batch.id, [(c.index, c.custom_id, c.url, c.body_json) for c in checked])
        for c in checked:
            if c.error is not None:
                self.store.record_result(batch.id, LineResult(c.index, c.custom_id, None, None, c.error))
        self.store.set_status(batch.id, "in_progress", in_progress_at=int(self._clock()))
        return True

    def _fail(self, batch: BatchRecord, code: str, message: str) -> bool:
        self.store.set_status(batch.id, "failed", failed_at=int(self._clock()),
                              errors=[{"code": code, "message": message, "line": None}])
        return False

    async def _run_lines(self, batch_id: str, owner: str) -> None:
        job = self._jobs.setdefault(batch_id, _Job())
        pending = self.store.pending_lines(batch_id)
        self.counts.queued += len(pending)
        tasks = [asyncio.create_task(self._run_line(batch_id, owner, line, job)) for line in pending]
        try:
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _run_line(self, batch_id: str, owner: str, line: tuple[int, str, str, str], job: _Job) -> None:
        index, custom_id, url, body_json = line
        assert self._seats is not None, "start() first"
        started = False
        try:
            async with self._seats:
                if job.cancel.is_set() or self._expired(batch_id, owner):
                    return
                self.counts.queued -= 1
                self.counts.running += 1
                started = True
                outcome = await self._call_until_served(url, json.loads(body_json), owner, job)
                if outcome is None:  # cancelled while it ran: aborted, no result kept
                    return
                status, response = outcome
                self.store.record_result(batch_id, LineResult(index, custom_id, status, response, None))
                self.counts.done += 1
        finally:
            if started:
                self.counts.running -= 1
            else:
                self.counts.queued -= 1

    async def _call_until_served(self, url: str, body: dict, owner: str, job: _Job) -> tuple[int, dict] | None:
        """The line's response; None if the job was cancelled first. A 503 (the model still
        loading, the server stopping) or 429 (queue full) is not the line's answer: it is asked
        again a little later, so only real answers are recorded."""
        while True:
            call = asyncio.ensure_future(self._call(url, body, owner))
            stop = asyncio.ensure_future(job.cancel.wait())
            try:
                await asyncio.wait({call, stop}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
            if not call.done():
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await call
                return None
            status, response = call.result()
            if status not in _RETRY_STATUSES:
                return status, response
            await asyncio.sleep(self.limits.retry_delay_s)

    def _expired(self, batch_id: str, owner: str) -> bool:
        batch = self.store.get_batch(owner, batch_id)
        return batch is not None and batch.expires_at is not None and self._clock() > batch.expires_at

    def _finish(self, batch_id: str, owner: str) -> None:
        batch = self.store.get_batch(owner, batch_id)
        assert batch is not None
        now = int(self._clock())
        job = self._jobs.get(batch_id)
        cancelled = batch.status == "cancelling" or (job is not None and job.cancel.is_set())
        left = [] if cancelled else self.store.pending_lines(batch_id)
        expired = bool(left)
        if expired:  # lines left only because the completion window passed
            for index, custom_id, _, _ in left:
                error = {"code": "batch_expired", "message": "This line was not executed because the batch expired."}
                self.store.record_result(batch_id, LineResult(index, custom_id, None, None, error))
        if batch.status != "finalizing":
            self.store.set_status(batch_id, "finalizing", finalizing_at=now)
        self.store.finalize(batch_id)
        if cancelled:
            self.store.set_status(batch_id, "cancelled", cancelled_at=now)
        elif expired:
            self.store.set_status(batch_id, "expired", expired_at=now)
        else:
            self.store.set_status(batch_id, "completed", completed_at=now)

    async def _retain(self) -> None:
        assert self.limits.retention_s is not None
        while True:
            removed = self.store.delete_older_than(self._clock() - self.limits.retention_s)
            if removed:
                log.info("retention: deleted %d batch job(s)", removed)
            await asyncio.sleep(self.limits.retention_check_s)


__all__ = ["BatchCounts", "BatchLimits", "BatchRunner", "LineCall", "LineCheck"]
