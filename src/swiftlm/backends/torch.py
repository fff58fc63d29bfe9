"""The plain reference backend: stock torch ops on any device, the oracle of tests.

The model runs its own ``forward`` (no fused modules, no step plan); attention is the torch
``PagedAttention`` (gather + SDPA for prefill, one padded SDPA call for decode); weight-only
quantisation, when asked, computes in plain torch (``backends/quant.py``). Every faster backend
is tested equal to this one.
"""

from __future__ import annotations

from swiftlm.backends.base import Backend
from swiftlm.backends.quant import quantize
from swiftlm.model.decoder import DecoderForCausalLM


class TorchBackend(Backend):
    name = "torch"

    def prepare(self, model: DecoderForCausalLM, quantization: str | None = None) -> None:
        self.plan = ["model: its own forward (stock torch ops)", "attention: torch (gather + SDPA)"]
        if quantization is not None:
            quantize(model, quantization)
            self.plan.append(f"linears: {quantization}, dequantised + F.linear (plain torch)")
        else:
            self.plan.append("linears: F.linear")
