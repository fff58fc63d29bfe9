"""Async load generator for OpenAI-compatible servers (httpx).

Sends a workload with at most `concurrency` requests in flight and records one `RequestRecord`
per request: time to first token, the gaps between streamed tokens, end-to-end latency, usage
(prompt / completion / cached / reasoning tokens) and, for failures, the kind of error. Errors
of the target (refused connections, HTTP errors, timeouts, malformed responses) are recorded,
never raised. The turns of one conversation run in order, each carrying the conversation so far
(with the assistant's actual replies); different conversations run concurrently.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import count, groupby

from tqdm import tqdm

from swiftlm.bench.load_config import LoadConfig
from swiftlm.bench.sender import ERROR_KINDS, RequestRecord, RequestSender, resolve_model
from swiftlm.bench.workloads import BenchRequest

__all__ = ["ERROR_KINDS", "LoadConfig", "RequestRecord", "RunResult", "run_load", "run_load_sync"]


@dataclass(frozen=True)
class RunResult:
    """The records of one run (in the order requests started) and its wall time."""

    concurrency: int
    records: tuple[RequestRecord, ...]
    duration_s: float
    model: str | None = None


def _conversations(requests: Sequence[BenchRequest], config: LoadConfig) -> Iterator[list[BenchRequest]]:
    """The workload as a stream of jobs (a conversation's turns, or one request), cut to
    `num_requests` or cycled for a duration run (later cycles get fresh session ids)."""
    groups = [list(g) for _, g in groupby(requests, key=lambda r: r.conversation_id)]
    if not groups:
        return
    limited = config.duration_s is None
    left = config.num_requests or len(requests)  # counts down only when limited
    for cycle in count():
        if limited and cycle > 0 and config.num_requests is None:
            return
        for group in groups:
            if limited and left <= 0:
                return
            job = group[:left] if limited else group
            left -= len(job)
            yield _for_cycle(job, cycle, len(groups))


def _for_cycle(group: list[BenchRequest], cycle: int, num_groups: int) -> list[BenchRequest]:
    if cycle == 0:
        return group
    return [
        dataclasses.replace(
            r,
            conversation_id=r.conversation_id + cycle * num_groups,
            session_id=None if r.session_id is None else f"{r.session_id}-r{cycle}",
        )
        for r in group
    ]


async def run_load(
    requests: Sequence[BenchRequest], config: LoadConfig, warmup: Sequence[BenchRequest] = ()
) -> RunResult:
    """Send `requests` as `config` says and record every one. `warmup` requests go first, with
    the same concurrency, and are not recorded."""
    model = config.model
    if model is None:
        model = await resolve_model(config.base_url, config.api_key, config.connect_timeout_s)
    if warmup:
        warm_cfg = dataclasses.replace(config, num_requests=None, duration_s=None, show_progress=False)
        await _drive(list(warmup), warm_cfg, model)
    return await _drive(list(requests), config, model)


async def _drive(requests: list[BenchRequest], config: LoadConfig, model: str | None) -> RunResult:
    t0 = time.perf_counter()
    deadline = None if config.duration_s is None else t0 + config.duration_s
    jobs = _conversations(requests, config)
    records: list[RequestRecord] = []
    total = None if deadline is not None else (config.num_requests or len(requests))
    bar = tqdm(
        total=total,
        desc=f"concurrency {config.concurrency}",
        unit="req",
        disable=not config.show_progress,
        leave=False,
    )
    gen = RequestSender(config, model, t0)
    failures = 0

    async def worker() -> None:
        nonlocal failures
        while deadline is None or time.perf_counter() < deadline:
            job = next(jobs, None)
            if job is None:
                return
            history: list[dict[str, str]] = []
            for position, request in enumerate(job):
                if deadline is not None and time.perf_counter() >= deadline:
                    return
                index = len(records)
                records.append(RequestRecord(index, request.kind))  # placeholder keeps start order
                record, reply = await gen.send(request, index, history)
                records[index] = record
                bar.update(1)
                if not record.ok:
                    failures += 1
                    bar.set_postfix(errors=failures)
                    bar.update(len(job) - position - 1)  # later turns need this reply: skip them
                    break
                history += [{"role": r, "content": c} for r, c in request.messages]
                history.append({"role": "assistant", "content": reply})

    try:
        await asyncio.gather(*(worker() for _ in range(config.concurrency)))
    finally:
        await gen.aclose()
        bar.close()
    return RunResult(config.concurrency, tuple(records), time.perf_counter() - t0, model)


def run_load_sync(
    requests: Sequence[BenchRequest], config: LoadConfig, warmup: Sequence[BenchRequest] = ()
) -> RunResult:
    """`run_load` for callers without an event loop."""
    return asyncio.run(run_load(requests, config, warmup))
