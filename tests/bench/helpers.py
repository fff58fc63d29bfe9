"""Synthetic request records for the report and A/B tests."""

from __future__ import annotations

from collections.abc import Sequence

from swiftlm.bench.client import RequestRecord, RunResult


def ok_record(
    index: int,
    latency: float,
    ttft: float,
    tokens: int = 10,
    prompt: int = 20,
    cached: int = 0,
    reasoning: int = 0,
) -> RequestRecord:
    gap = (latency - ttft) / max(1, tokens - 1)
    return RequestRecord(
        index,
        "chat",
        ok=True,
        status=200,
        start=0.01 * index,
        ttft=ttft,
        latency=latency,
        itl=[gap] * (tokens - 1),
        prompt_tokens=prompt,
        completion_tokens=tokens,
        cached_tokens=cached,
        reasoning_tokens=reasoning,
        usage_reported=True,
        output_chars=5 * tokens,
    )


def failed_record(index: int, error: str, latency: float = 0.01, status: int | None = None) -> RequestRecord:
    return RequestRecord(
        index, "chat", ok=False, error=error, status=status, start=0.01 * index, latency=latency
    )


def run_of(
    latencies: Sequence[float],
    duration_s: float = 10.0,
    concurrency: int = 4,
    tokens: int = 10,
    failures: Sequence[str] = (),
) -> RunResult:
    records = [ok_record(i, lat, 0.2 * lat, tokens) for i, lat in enumerate(latencies)]
    records += [failed_record(len(records) + i, kind) for i, kind in enumerate(failures)]
    return RunResult(concurrency, tuple(records), duration_s, "fake-model")
