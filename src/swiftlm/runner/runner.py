"""ModelRunner: runs one scheduled step through the model and samples. Makes no policy decisions.

Device-agnostic: the backend it is given runs the forward pass and owns attention over the KV cache."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from swiftlm.backends.base import Backend
from swiftlm.backends.kv_cache import KVCache
from swiftlm.core.schedule import SchedulerOutput
from swiftlm.model.qwen3 import Qwen3ForCausalLM
from swiftlm.runner.inputs import build_step_inputs
from swiftlm.runner.sampler import Sampler, SamplingRow


@dataclass(frozen=True, slots=True)
class SampledToken:
    token_id: int
    logprobs: dict[int, float] | None  # sampled token first, then the top tokens


class ModelRunner:
    def __init__(self, model: Qwen3ForCausalLM, kv_cache: KVCache, backend: Backend) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.backend = backend
        self.attention = backend.attention(kv_cache)
        self.sampler = Sampler()
        self.device = backend.device

    @torch.inference_mode()
    def execute(self, step: SchedulerOutput, rows: Sequence[SamplingRow]) -> list[SampledToken | None]:
        """One result per scheduled request: the sampled token, or None (mid-prefill chunk).

        ``rows`` holds the sampling settings of the requests that sample, in scheduled order.
        """
        inputs = build_step_inputs(step.scheduled, self.kv_cache.block_size, self.device)
        results: list[SampledToken | None] = [None] * len(step.scheduled)
        attention = self.attention.bind(inputs.attention)
        hidden = self.backend.forward(self.model, inputs.input_ids, inputs.positions, attention)
        if not inputs.sampling_requests:
            return results
        logits = self.model.compute_logits(hidden[inputs.logits_indices])  # [S, V] float32
        out = self.sampler(logits, rows)
        for j, i in enumerate(inputs.sampling_requests):
            token = out.token_ids[j]
            logprobs = None
            if rows[j].params.logprobs is not None:
                logprobs = {token: out.logprobs[j]}
                for tid, lp in out.top_logprobs[j] or ():
                    logprobs.setdefault(tid, lp)
            results[i] = SampledToken(token, logprobs)
        return results
