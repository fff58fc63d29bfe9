"""The Backend interface: everything that depends on the device, behind one object.

A backend is built once from ``EngineConfig`` and the machine (``backends.build_backend``) and
owns, for the model it prepares:

* ``prepare(model)``: the transformations of the loaded model (fusing, quantising, placing
  weights, swapping in faster linear modules), done once before the first step;
* ``allocate_kv_cache(...)``: the paged K/V pools, placed the device's way;
* ``attention(kv_cache)``: attention over those pools, prefill and decode (``PagedAttention``
  with or without a decode kernel);
* ``forward(model, input_ids, positions, attention)``: one step's forward pass, the model's own
  ``forward`` or a step plan of the backend's (fused ops, all layers in one call);
* ``describe()``: the chosen plan in words: which kernel serves which rows, which ops fell back
  and why. The engine logs it once at start.

Contract: every kernel states what it supports (dtype, head_dim, group size, rows, instruction
set) and a backend checks that when it prepares a model, falling back per op to the reference
with the reason in ``fallbacks``. A checkpoint that the reference runs must never crash a kernel.

``TorchBackend`` (``backends/torch.py``) is the trivial implementation and the oracle of tests:
stock torch ops on any device.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

from swiftlm.backends.attention import PagedAttention
from swiftlm.backends.kv_cache import KVCache
from swiftlm.backends.kv_quant import KVFormat
from swiftlm.config import DEFAULT_BLOCK_SIZE, ModelConfig
from swiftlm.model.decoder import Attention, DecoderForCausalLM
from swiftlm.platform import resolve_dtype


@dataclass(frozen=True, slots=True)
class Fallback:
    """An op that runs the reference instead of a kernel, and why."""

    op: str
    reason: str

    def __str__(self) -> str:
        return f"{self.op}: {self.reason}"


class Backend(ABC):
    name: str = "backend"
    # whether the engine overlaps steps here unless told (``EngineConfig.async_scheduling``): where
    # the host's work between steps is a real share of a step and the device runs apart from it
    overlaps_steps_by_default: bool = False

    def __init__(self, device: str) -> None:
        self.device = device
        self.fallbacks: list[Fallback] = []  # filled by prepare()
        self.plan: list[str] = []  # what runs where, in words; filled by prepare()

    def resolve_dtype(self, name: str) -> str:
        """The dtype to load the model in for ``--dtype name``: ``auto`` becomes the machine's default
        (``platform.resolve_dtype``) unless the backend knows better; any other name is kept."""
        return resolve_dtype(name, self.device)

    @abstractmethod
    def prepare(self, model: DecoderForCausalLM, quantization: str | None = None) -> None:
        """Transform ``model`` (in place) for this device, once, before the first step."""

    def default_block_size(self, fmt: KVFormat | None) -> int:
        """Tokens a KV block holds when the configuration leaves it open (``--block-size`` not given),
        for a cache of ``fmt`` (None: the model's dtype). 16, vLLM's default on a GPU."""
        return DEFAULT_BLOCK_SIZE

    def allocate_kv_cache(
        self, model: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, fmt: KVFormat | None = None
    ) -> KVCache:
        """The pools; ``fmt``: the small KV cache's format (None: ``dtype`` values)."""
        return KVCache(model, num_blocks, block_size, dtype, self.device, fmt=fmt)

    def attention(self, kv_cache: KVCache) -> PagedAttention:
        """Attention over ``kv_cache`` for the steps of the model this backend prepared."""
        return PagedAttention(kv_cache)

    def forward(
        self, model: DecoderForCausalLM, input_ids: torch.Tensor, positions: torch.Tensor, attention: Attention
    ) -> torch.Tensor:
        """input_ids, positions: [T] -> final hidden states [T, hidden]."""
        return model(input_ids, positions, attention)

    def greedy_pick(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """logits [B, V] float32 -> (each row's argmax, the lowest id on ties, [B] int64; whether all
        of its logits are finite [B] bool) in one pass, where this device has a kernel for it; None:
        the caller checks and samples as usual."""
        return None

    @property
    def draws_tokens(self) -> bool:
        """Whether ``draw_tokens`` has a kernel here (the caller builds its inputs only then)."""
        return False

    def draw_tokens(
        self, logits: torch.Tensor, temperature: torch.Tensor, log_min_p: torch.Tensor, uniform: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """logits [B, V] float32 -> (one token per row [B] int64, whether the row's logits are all
        finite [B] bool) in one pass, where this device has a kernel for it: rows whose
        ``temperature`` [B] is 0 take the argmax, the others one draw after temperature and min-p
        (``log_min_p`` [B], -inf: none) from their ``uniform`` [B], as
        ``swiftlm.runner.sampler.sample_on_device``. None: the caller draws with torch."""
        return None

    def step_launched(self) -> Any:
        """Called when a step's work has been given to the device: something whose ``synchronize()``
        waits for that work (a CUDA event), or None where the work is done when the call returns."""
        return None

    def activation_bytes(self, model: DecoderForCausalLM, block_size: int, max_rows: int, head_rows: int) -> int | None:
        """The measured memory of one step of ``max_rows`` tokens beyond the weights, for a device
        whose KV pool takes what is left (None: not measured, a fixed reserve is kept)."""
        return None

    def warm_up(self, model: DecoderForCausalLM, max_rows: int, head_rows: int) -> str | None:
        """Whatever the device builds lazily per shape, built now for steps of up to ``max_rows``
        tokens and ``head_rows`` sampled rows; returns what was done in words (None: nothing)."""
        return None

    def fell_back(self, op: str, reason: str) -> None:
        self.fallbacks.append(Fallback(op, reason))

    def describe(self) -> str:
        """The plan in words, one line per decision, fallbacks last."""
        lines = [f"backend {self.name} on {self.device}"]
        lines += [f"  {line}" for line in self.plan]
        lines += [f"  fallback to the reference: {f}" for f in self.fallbacks]
        return "\n".join(lines)
