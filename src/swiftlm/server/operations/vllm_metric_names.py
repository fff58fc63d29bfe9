"""``--metric-names vllm``: the metrics whose meaning vLLM shares, exported a second time under
vLLM's names (``vllm:...``, same labels, ``model_name`` first), so its dashboards keep working.

The copies are made at scrape time from the ``swiftlm:`` families of the server's registry, in
the same pass that exports those; the ``swiftlm:`` names stay.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

# swiftlm family -> vLLM families of the same meaning (vLLM v1 names first, then older ones that
# dashboards still query: gpu_cache_usage_perc before v1, time_per_output_token_seconds for ITL)
VLLM_NAMES: dict[str, tuple[str, ...]] = {
    "swiftlm:time_to_first_token_seconds": ("vllm:time_to_first_token_seconds",),
    "swiftlm:inter_token_latency_seconds": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "swiftlm:time_per_output_token_seconds": ("vllm:request_time_per_output_token_seconds",),
    "swiftlm:e2e_request_latency_seconds": ("vllm:e2e_request_latency_seconds",),
    "swiftlm:request_queue_time_seconds": ("vllm:request_queue_time_seconds",),
    "swiftlm:num_requests_running": ("vllm:num_requests_running",),
    "swiftlm:num_requests_waiting": ("vllm:num_requests_waiting",),
    "swiftlm:kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "swiftlm:prompt_tokens": ("vllm:prompt_tokens",),
    "swiftlm:generation_tokens": ("vllm:generation_tokens",),
    "swiftlm:request_success": ("vllm:request_success",),
    "swiftlm:prefix_cache_queries": ("vllm:prefix_cache_queries",),
    "swiftlm:prefix_cache_hits": ("vllm:prefix_cache_hits",),
    "swiftlm:num_preemptions": ("vllm:num_preemptions",),
    "swiftlm:spec_decode_num_drafts": ("vllm:spec_decode_num_drafts",),
    "swiftlm:spec_decode_num_draft_tokens": ("vllm:spec_decode_num_draft_tokens",),
    "swiftlm:spec_decode_num_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens",),
    "swiftlm:spec_decode_num_accepted_tokens_per_pos": ("vllm:spec_decode_num_accepted_tokens_per_pos",),
}


def renamed(family: Metric, name: str) -> Metric:
    """``family`` under ``name``: each sample's name keeps its suffix (_bucket, _total, ...)."""
    copy = Metric(name, family.documentation, family.type, family.unit)
    copy.samples = [s._replace(name=name + s.name[len(family.name):]) for s in family.samples]
    return copy


class WithVllmNames(Collector):
    """Every family of ``source``, each followed by its copies under the vLLM names that
    ``VLLM_NAMES`` lists (one collection of ``source`` per scrape). Register it on a registry of
    its own: collecting ``source`` from inside ``source`` would recurse."""

    def __init__(self, source: CollectorRegistry) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            yield family
            for name in VLLM_NAMES.get(family.name, ()):
                yield renamed(family, name)
