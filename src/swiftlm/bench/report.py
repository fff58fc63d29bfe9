"""Benchmark numbers from request records, and the JSON and Markdown reports that carry them.

Every number in a summary is recomputed from the records it sits beside:

- latency, TTFT, TPOT and ITL statistics cover successful requests only (TTFT and ITL need a
  streamed response); percentiles interpolate linearly between order statistics (numpy's default);
- TPOT of a request = (latency - ttft) / (completion_tokens - 1), for requests with 2+ tokens;
- requests/s and output tokens/s count successful requests over the run's wall time;
- success rate = successful / all requests; `errors` counts failures by kind.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from swiftlm.bench.client import RequestRecord, RunResult

STAT_NAMES = ("avg", "min", "max", "p50", "p90", "p95", "p99")
LATENCY_METRICS = ("latency", "ttft", "tpot", "itl")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation; `values` must not be empty."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def describe(values: Sequence[float]) -> dict[str, float | None]:
    """avg, min, max, p50, p90, p95, p99 of `values` (all None when empty)."""
    if not values:
        return dict.fromkeys(STAT_NAMES)
    out: dict[str, float | None] = {"avg": sum(values) / len(values), "min": min(values), "max": max(values)}
    out.update({f"p{q}": percentile(values, q) for q in (50, 90, 95, 99)})
    return out


def request_tpot(record: RequestRecord) -> float | None:
    """Time per output token after the first, or None when it cannot be measured."""
    if not record.ok or record.ttft is None or record.latency is None or (record.completion_tokens or 0) < 2:
        return None
    return (record.latency - record.ttft) / (record.completion_tokens - 1)


def metric_values(records: Sequence[RequestRecord], metric: str) -> list[float]:
    """Per-request values of "latency", "ttft", "tpot" (successful requests), or "itl" (their gaps)."""
    ok = [r for r in records if r.ok]
    if metric == "latency":
        return [r.latency for r in ok if r.latency is not None]
    if metric == "ttft":
        return [r.ttft for r in ok if r.ttft is not None]
    if metric == "tpot":
        return [t for t in map(request_tpot, ok) if t is not None]
    if metric == "itl":
        return [gap for r in ok for gap in r.itl]
    raise ValueError(f"unknown metric {metric!r}; choose one of {LATENCY_METRICS}")


def summarize(records: Sequence[RequestRecord], duration_s: float) -> dict[str, Any]:
    """The summary of one run (see the module docstring for definitions)."""
    ok = [r for r in records if r.ok]
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    completion = sum(r.completion_tokens or 0 for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: 0.0)
    summary: dict[str, Any] = {
        "num_requests": len(records),
        "num_ok": len(ok),
        "num_failed": len(records) - len(ok),
        "success_rate": len(ok) / len(records) if records else 0.0,
        "errors": dict(sorted(Counter(r.error or "unknown" for r in records if not r.ok).items())),
        "duration_s": duration_s,
        "requests_per_s": per_s(len(ok)),
        "output_tokens_per_s": per_s(completion),
        "total_prompt_tokens": prompt,
        "total_completion_tokens": completion,
        "total_cached_tokens": cached,
        "total_reasoning_tokens": sum(r.reasoning_tokens or 0 for r in ok),
        "cached_token_ratio": cached / prompt if prompt else 0.0,
    }
    for metric in LATENCY_METRICS:
        summary[f"{metric}_s"] = describe(metric_values(records, metric))
    return summary


def run_to_dict(run: RunResult) -> dict[str, Any]:
    return {
        "concurrency": run.concurrency,
        "model": run.model,
        "summary": summarize(run.records, run.duration_s),
        "records": [r.to_dict() for r in run.records],
    }


def write_json(path: str | Path, runs: Sequence[RunResult], meta: Mapping[str, Any]) -> Path:
    """{"meta": ..., "runs": [{"concurrency", "model", "summary", "records"}, ...]}."""
    path = Path(path)
    path.write_text(json.dumps({"meta": dict(meta), "runs": [run_to_dict(r) for r in runs]}, indent=2) + "\n")
    return path


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _errors(errors: Mapping[str, int]) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in errors.items()) or "-"


def render_markdown(runs: Sequence[RunResult], meta: Mapping[str, Any]) -> str:
    """A throughput table (one row per concurrency) and a latency table (ms)."""
    lines = [f"# swiftlm bench serve: {meta.get('workload', '?')}", ""]
    lines += [f"- {key}: `{value}`" for key, value in meta.items()]
    lines += [
        "",
        "## Throughput",
        "",
        "| concurrency | requests | success | errors | requests/s | output tok/s | mean TPOT (ms) "
        "| mean ITL (ms) | cached prompt tokens |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    summaries = [(run.concurrency, summarize(run.records, run.duration_s)) for run in runs]
    for c, s in summaries:
        lines.append(
            f"| {c} | {s['num_requests']} | {s['success_rate']:.1%} | {_errors(s['errors'])} "
            f"| {s['requests_per_s']:.2f} | {s['output_tokens_per_s']:.1f} | {_ms(s['tpot_s']['avg'])} "
            f"| {_ms(s['itl_s']['avg'])} | {s['cached_token_ratio']:.1%} |"
        )
    lines += [
        "",
        "## Latency (ms)",
        "",
        "| concurrency | metric | " + " | ".join(STAT_NAMES) + " |",
        "|---:|---|" + "---:|" * len(STAT_NAMES),
    ]
    for c, s in summaries:
        for metric, label in (("latency", "end-to-end"), ("ttft", "TTFT"), ("tpot", "TPOT")):
            stats = s[f"{metric}_s"]
            lines.append(f"| {c} | {label} | " + " | ".join(_ms(stats[k]) for k in STAT_NAMES) + " |")
    return "\n".join(lines) + "\n"


def write_markdown(path: str | Path, runs: Sequence[RunResult], meta: Mapping[str, Any]) -> Path:
    path = Path(path)
    path.write_text(render_markdown(runs, meta))
    return path
