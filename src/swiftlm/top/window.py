"""The figures of the last minute, from two scrapes: the newest and the oldest one still in the
window. Counters become rates and histograms become quantiles of their bucket deltas (as
Prometheus' ``histogram_quantile(q, increase(..._bucket[1m]))`` computes them)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from swiftlm.top.scrape import Scrape

WINDOW_S = 60.0


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of cumulative ``buckets`` [(upper bound, count)], linear within a bucket
    (the first bucket starts at 0); None when there are no observations. An answer in the +Inf
    bucket is the largest finite bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower
            inside = count - below  # observations in (lower, bound]
            return lower + (bound - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = bound, count
    return lower


def bucket_delta(new: Scrape, old: Scrape | None, histogram: str) -> list[tuple[float, float]]:
    """``new``'s cumulative buckets minus ``old``'s (a counter that went down means a restart:
    ``new`` alone counts)."""
    now = new.buckets(histogram)
    if old is None:
        return now
    before = dict(old.buckets(histogram))
    delta = [(bound, count - before.get(bound, 0.0)) for bound, count in now]
    return now if any(c < 0 for _, c in delta) else delta


@dataclass(frozen=True)
class Gpu:
    index: str
    name: str
    utilization: float | None
    memory_used: float | None
    memory_total: float | None
    power_w: float | None
    temperature_c: float | None


@dataclass(frozen=True)
class Figures:
    """What the view shows. ``span_s``: the seconds the rates and quantiles cover (None: a single
    scrape; quantiles then cover everything since the server started, rates are unknown)."""

    models: tuple[str, ...]
    span_s: float | None
    running: float | None
    waiting: float | None
    refused: float  # requests refused within the span (since start for one scrape)
    refused_by_reason: Mapping[str, float]
    finished_per_s: float | None
    output_tok_per_s: float | None
    ttft_p50: float | None
    ttft_p95: float | None
    itl_p50: float | None
    itl_p95: float | None
    kv_cache_usage: float | None
    prefix_hit_rate: float | None
    sessions: float | None
    batch_queued: float | None  # None: the Batch API is off
    batch_running: float | None
    batch_done: float | None
    backend: Mapping[str, str]
    threads: float | None
    cpu_percent: float | None  # of one core, over the span
    rss_bytes: float | None
    gpus: tuple[Gpu, ...] = field(default=())


def _delta(new: Scrape, old: Scrape | None, name: str, **labels: str) -> float | None:
    now = new.value(name, **labels)
    if now is None:
        return None
    before = old.value(name, **labels) if old is not None else 0.0
    return now if before is None or now < before else now - before


def _rate(new: Scrape, old: Scrape | None, name: str, span: float | None) -> float | None:
    if old is None or not span:
        return None
    delta = _delta(new, old, name)
    return None if delta is None else delta / span


def figures(new: Scrape, old: Scrape | None) -> Figures:
    """The figures between ``old`` (None: since the server started) and ``new``."""
    span = new.time - old.time if old is not None else None
    refused_now = new.by_label("swiftlm:request_rejected_total", "reason")
    refused_before = old.by_label("swiftlm:request_rejected_total", "reason") if old is not None else {}
    by_reason = {r: v - refused_before.get(r, 0.0) for r, v in refused_now.items()}
    by_reason = {r: v for r, v in by_reason.items() if v > 0}
    hits = _delta(new, old, "swiftlm:prefix_cache_hits_total")
    queries = _delta(new, old, "swiftlm:prefix_cache_queries_total")
    ttft = bucket_delta(new, old, "swiftlm:time_to_first_token_seconds")
    itl = bucket_delta(new, old, "swiftlm:inter_token_latency_seconds")
    cpu = _rate(new, old, "process_cpu_seconds_total", span)
    info = new.labels_of("swiftlm:backend_info")
    models = {labels.get("model_name") for labels in new.labels_of("swiftlm:num_requests_running")}
    models |= {labels.get("model_name") for labels in new.labels_of("swiftlm:generation_tokens_total")}
    return Figures(
        models=tuple(sorted(m for m in models if m)),
        span_s=span,
        running=new.value("swiftlm:num_requests_running"),
        waiting=new.value("swiftlm:num_requests_waiting"),
        refused=sum(by_reason.values()),
        refused_by_reason=by_reason,
        finished_per_s=_rate(new, old, "swiftlm:request_success_total", span),
        output_tok_per_s=_rate(new, old, "swiftlm:generation_tokens_total", span),
        ttft_p50=quantile(0.5, ttft),
        ttft_p95=quantile(0.95, ttft),
        itl_p50=quantile(0.5, itl),
        itl_p95=quantile(0.95, itl),
        kv_cache_usage=new.value("swiftlm:kv_cache_usage_perc"),
        prefix_hit_rate=hits / queries if hits is not None and queries else None,
        sessions=new.value("swiftlm:num_sessions"),
        batch_queued=new.value("swiftlm:batch_lines_queued"),
        batch_running=new.value("swiftlm:batch_lines_running"),
        batch_done=new.value("swiftlm:batch_lines_done_total"),
        backend=dict(info[0]) if info else {},
        threads=new.value("swiftlm:compute_threads"),
        cpu_percent=None if cpu is None else cpu * 100.0,
        rss_bytes=new.value("process_resident_memory_bytes"),
        gpus=_gpus(new),
    )


def _gpus(scrape: Scrape) -> tuple[Gpu, ...]:
    gpus = []
    for labels in scrape.labels_of("swiftlm:gpu_memory_total_bytes"):
        index, name = labels.get("gpu", ""), labels.get("name", "")

        def read(metric: str, index: str = index) -> float | None:
            return scrape.value(metric, gpu=index)

        gpus.append(Gpu(index, name, read("swiftlm:gpu_utilization_perc"), read("swiftlm:gpu_memory_used_bytes"),
                        read("swiftlm:gpu_memory_total_bytes"), read("swiftlm:gpu_power_watts"),
                        read("swiftlm:gpu_temperature_celsius")))
    return tuple(gpus)


class Window:
    """The scrapes of the last ``span_s`` seconds (and the newest one older than that, so a
    full minute is covered once a minute has passed)."""

    def __init__(self, span_s: float = WINDOW_S) -> None:
        self.span_s = span_s
        self._scrapes: deque[Scrape] = deque()

    def add(self, scrape: Scrape) -> Figures:
        self._scrapes.append(scrape)
        # keep one scrape at or beyond the window's start: drop the oldest while the next is too
        while len(self._scrapes) > 2 and scrape.time - self._scrapes[1].time >= self.span_s:
            self._scrapes.popleft()
        old = self._scrapes[0] if len(self._scrapes) > 1 else None
        return figures(scrape, old)
