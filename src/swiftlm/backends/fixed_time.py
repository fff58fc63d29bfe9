"""A backend whose forward takes a fixed device time: measuring overlapped steps without a GPU.

``FixedTimeBackend(inner, device_seconds=D)`` runs ``inner``'s forward (a tiny model: it costs
little) and then sleeps until D seconds have passed since the forward began. The sleep releases
the GIL, as a GPU's step leaves the host free, so with overlapped steps a step should take
``max(host, D)`` and serially ``host + D`` (``benchmarks/engine/overlap.py``; the tests check the
order of events instead of times). ``run_model=False`` skips the layers (the hidden states are the
input embeddings; the KV cache is not written), so that on a CPU the device's share of a step is
D and the lm_head alone, not the model's compute competing with the host for the cores: a
measuring device for the engine's timing, whose tokens mean nothing. ``asynchronous=True`` models
a GPU's launches too: the forward returns at once and the step's D seconds run on the device's own
clock, after the step before (``step_launched`` gives the host something to wait on), so that nothing
the engine does on its threads is taken for device time. Everything else is ``inner``'s.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from swiftlm.backends.attention import PagedAttention
from swiftlm.backends.base import Backend
from swiftlm.backends.kv_cache import KVCache
from swiftlm.backends.kv_quant import KVFormat
from swiftlm.config import ModelConfig
from swiftlm.model.decoder import DecoderForCausalLM


class FixedTimeBackend(Backend):
    def __init__(self, inner: Backend, device_seconds: float, run_model: bool = True, asynchronous: bool = False) -> None:
        super().__init__(inner.device)
        self.inner = inner
        self.device_seconds = device_seconds
        self.run_model = run_model
        self.asynchronous = asynchronous
        self._busy_until = 0.0  # asynchronous: when the device ends the work it has been given
        self.name = f"{inner.name}+{device_seconds * 1e3:g}ms"
        self.overlaps_steps_by_default = True

    def resolve_dtype(self, name: str) -> str:
        return self.inner.resolve_dtype(name)

    def prepare(self, model: DecoderForCausalLM, quantization: str | None = None) -> None:
        self.inner.prepare(model, quantization)
        self.fallbacks, self.plan = self.inner.fallbacks, self.inner.plan

    def default_block_size(self, fmt: KVFormat | None) -> int:
        return self.inner.default_block_size(fmt)

    def allocate_kv_cache(
        self, model: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, fmt: KVFormat | None = None
    ) -> KVCache:
        return self.inner.allocate_kv_cache(model, num_blocks, block_size, dtype, fmt)

    def attention(self, kv_cache: KVCache) -> PagedAttention:
        return self.inner.attention(kv_cache)

    def forward(self, model: DecoderForCausalLM, input_ids: torch.Tensor, positions: torch.Tensor,
                attention: Any) -> torch.Tensor:
        start = time.perf_counter()
        if self.run_model:
            hidden = self.inner.forward(model, input_ids, positions, attention)
        else:
            hidden = model.model.embed_tokens(input_ids)  # [T, hidden]: no layers, no KV written
        left = self.device_seconds - (time.perf_counter() - start)
        if left > 0 and not self.asynchronous:
            time.sleep(left)  # the device's time: the GIL is free meanwhile
        return hidden

    def step_launched(self) -> _Deadline | None:
        if not self.asynchronous:
            return None
        self._busy_until = max(time.perf_counter(), self._busy_until) + self.device_seconds
        return _Deadline(self._busy_until)

    def greedy_pick(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self.inner.greedy_pick(logits)

    @property
    def draws_tokens(self) -> bool:
        return self.inner.draws_tokens

    def draw_tokens(
        self, logits: torch.Tensor, temperature: torch.Tensor, log_min_p: torch.Tensor, uniform: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self.inner.draw_tokens(logits, temperature, log_min_p, uniform)

    def activation_bytes(self, model: DecoderForCausalLM, block_size: int, max_rows: int, head_rows: int) -> int | None:
        return self.inner.activation_bytes(model, block_size, max_rows, head_rows)

    def warm_up(self, model: DecoderForCausalLM, max_rows: int, head_rows: int) -> str | None:
        return self.inner.warm_up(model, max_rows, head_rows)

    def describe(self) -> str:
        return f"{self.inner.describe()}; every forward takes at least {self.device_seconds * 1e3:g} ms (test backend)"


class _Deadline:
    """The asynchronous device's event: ``synchronize()`` sleeps until its step ends."""

    def __init__(self, at: float) -> None:
        self.at = at

    def synchronize(self) -> None:
        left = self.at - time.perf_counter()
        if left > 0:
            time.sleep(left)
