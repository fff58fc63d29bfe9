"""Prometheus metrics, in vLLM's naming style with a ``swiftlm:`` prefix.

Everything lives in the registry of one ``ServerMetrics`` object made by ``create_app``; engine
state (running / waiting requests, KV usage, prefix-cache counters, sessions) is read from the
engine at scrape time rather than copied on every step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from swiftlm.batch.runner import BatchCounts
from swiftlm.core.outputs import RequestMetrics
from swiftlm.engine.engine import Engine, EngineStats
from swiftlm.server.answer_cache.policy import CacheStats
from swiftlm.server.operations.device_metrics import BackendPlan, DeviceCollector, NvmlCollector
from swiftlm.server.operations.vllm_metric_names import WithVllmNames

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class _EngineCollector(Collector):
    def __init__(self, stats: Callable[[], EngineStats | None], model: str) -> None:
        self._stats = stats
        self._model = model

    def collect(self) -> Iterator:
        stats = self._stats()
        if stats is None:
            return
        labels = ["model_name"]
        for name, doc, value in (
            ("swiftlm:num_requests_running", "Requests in the running batch.", stats.num_running),
            ("swiftlm:num_requests_waiting", "Requests waiting to be scheduled.", stats.num_waiting),
            ("swiftlm:kv_cache_usage_perc", "Fraction of KV cache blocks in use (0..1).", stats.kv_cache_usage),
            ("swiftlm:num_sessions", "Sessions holding KV between turns.", stats.num_sessions),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            gauge.add_metric([self._model], value)
            yield gauge
        for name, doc, value in (
            ("swiftlm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", stats.prefix_cache_queries),
            ("swiftlm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", stats.prefix_cache_hits),
            ("swiftlm:num_preemptions", "Requests preempted for lack of KV blocks.", stats.num_preemptions),
            ("swiftlm:num_aborted_requests", "Requests aborted (client gone or cancelled).", stats.num_aborted),
            ("swiftlm:engine_failed_steps", "Model steps that raised (their requests failed).", stats.num_failed_steps),
            ("swiftlm:engine_failed_rows", "Requests failed alone for non-finite logits.", stats.num_failed_rows),
            ("swiftlm:spec_decode_num_drafts", "Speculative drafts verified.", stats.spec_num_drafts),
            ("swiftlm:spec_decode_num_draft_tokens", "Draft tokens verified.", stats.spec_num_draft_tokens),
            ("swiftlm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", stats.spec_num_accepted_tokens),
        ):
            counter = CounterMetricFamily(name, doc, labels=labels)
            counter.add_metric([self._model], value)
            yield counter
        if stats.spec_accepted_per_position:  # acceptance rate: accepted / draft tokens; per step: 1 + accepted / drafts
            by_position = CounterMetricFamily(
                "swiftlm:spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted, by position in the draft.",
                labels=[*labels, "position"],
            )
            for pos, value in enumerate(stats.spec_accepted_per_position):
                by_position.add_metric([self._model, str(pos)], value)
            yield by_position


class _BatchCollector(Collector):
    """Batch API lines over all jobs: queued for a seat, running, finished by this process."""

    def __init__(self, counts: Callable[[], BatchCounts], model: str) -> None:
        self._counts = counts
        self._model = model

    def collect(self) -> Iterator:
        counts = self._counts()
        for name, doc, value in (
            ("swiftlm:batch_lines_queued", "Batch API lines waiting for a seat.", counts.queued),
            ("swiftlm:batch_lines_running", "Batch API lines handed to the engine.", counts.running),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=["model_name"])
            gauge.add_metric([self._model], value)
            yield gauge
        done = CounterMetricFamily("swiftlm:batch_lines_done", "Batch API lines answered.", labels=["model_name"])
        done.add_metric([self._model], counts.done)
        yield done


class _ResponseCacheCollector(Collector):
    """The response cache: lookups answered (hits) and not (misses), what it holds now."""

    def __init__(self, stats: Callable[[], CacheStats], model: str) -> None:
        self._stats = stats
        self._model = model

    def collect(self) -> Iterator:
        stats = self._stats()
        for name, doc, value, family in (
            ("swiftlm:response_cache_hits", "Requests answered from the response cache.", stats.hits, CounterMetricFamily),
            ("swiftlm:response_cache_misses", "Cacheable requests not found in the response cache.", stats.misses,
             CounterMetricFamily),
            ("swiftlm:response_cache_entries", "Answers held by the response cache.", stats.entries, GaugeMetricFamily),
            ("swiftlm:response_cache_bytes", "Bytes of answers held by the response cache.", stats.bytes,
             GaugeMetricFamily),
        ):
            metric = family(name, doc, labels=["model_name"])
            metric.add_metric([self._model], value)
            yield metric


class ServerMetrics:
    def __init__(self, model: str, stats: Callable[[], EngineStats | None]) -> None:
        self.model = model
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name"]
        r = self.registry
        self.ttft = Histogram("swiftlm:time_to_first_token_seconds", "Time to first token.", labels, registry=r, buckets=_LATENCY_BUCKETS)
        self.itl = Histogram("swiftlm:inter_token_latency_seconds", "Time between streamed output deltas.", labels, registry=r, buckets=_TOKEN_BUCKETS)
        self.tpot = Histogram("swiftlm:time_per_output_token_seconds", "Mean time per output token after the first, per request.", labels, registry=r, buckets=_TOKEN_BUCKETS)
        self.e2e = Histogram("swiftlm:e2e_request_latency_seconds", "End-to-end request latency.", labels, registry=r, buckets=_LATENCY_BUCKETS)
        self.queue_time = Histogram("swiftlm:request_queue_time_seconds", "Time from arrival to first scheduling.", labels, registry=r, buckets=_LATENCY_BUCKETS)
        self.prompt_tokens = Counter("swiftlm:prompt_tokens", "Prompt tokens processed.", labels, registry=r)
        self.generation_tokens = Counter("swiftlm:generation_tokens", "Tokens generated.", labels, registry=r)
        self.success = Counter("swiftlm:request_success", "Finished requests by finish reason.", [*labels, "finished_reason"], registry=r)
        self.rejected = Counter("swiftlm:request_rejected", "Requests refused, by reason.", [*labels, "reason"], registry=r)
        self.tool_call_parse_errors = Counter(
            "swiftlm:tool_call_parse_errors", "Tool calls whose JSON did not parse, returned as content.", labels, registry=r
        )
        r.register(_EngineCollector(stats, model))
        self.thinking_auto = Counter(
            "swiftlm:thinking_auto_decisions", 'Thinking decided by the rule set (enable_thinking "auto"), by outcome.',
            [*labels, "decision"], registry=r,
        )
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        self.exported = r  # what /metrics renders: r, or r and the vLLM names (--metric-names vllm)

    def observe_finished(self, metrics: RequestMetrics | None, prompt_tokens: int, output_tokens: int, finish_reason: str) -> None:
        m = self.model
        self.prompt_tokens.labels(m).inc(prompt_tokens)
        self.generation_tokens.labels(m).inc(output_tokens)
        self.success.labels(m, finish_reason).inc()
        if metrics is None:
            return
        if metrics.first_scheduled_time is not None:
            self.queue_time.labels(m).observe(metrics.first_scheduled_time - metrics.arrival_time)
        if metrics.first_token_time is not None:
            self.ttft.labels(m).observe(metrics.first_token_time - metrics.arrival_time)
            if metrics.finished_time is not None:
                self.e2e.labels(m).observe(metrics.finished_time - metrics.arrival_time)
                if output_tokens > 1:
                    self.tpot.labels(m).observe((metrics.finished_time - metrics.first_token_time) / (output_tokens - 1))

    def watch_batches(self, counts: Callable[[], BatchCounts]) -> None:
        """Report the Batch API's line counts (when it is on)."""
        self.registry.register(_BatchCollector(counts, self.model))

    def watch_device(self, engine: Engine) -> None:
        """Report what ``engine`` runs on: threads, the backend's plan and, on CUDA, its GPUs."""
        self.registry.register(DeviceCollector(BackendPlan.of(engine), self.model))
        if str(engine.backend.device).startswith("cuda"):
            self.registry.register(NvmlCollector())

    def export_vllm_names(self) -> None:
        """Also export the metrics vLLM has under its names (``vllm:...``)."""
        self.exported = CollectorRegistry(auto_describe=False)
        self.exported.register(WithVllmNames(self.registry))

    def watch_response_cache(self, stats: Callable[[], CacheStats]) -> None:
        """Report the response cache's hits, misses, entries and bytes (when it is on)."""
        self.registry.register(_ResponseCacheCollector(stats, self.model))

    def observe_rejected(self, reason: str) -> None:
        self.rejected.labels(self.model, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.exported)
