"""place_weights_in_arena: one buffer in reading order, ties kept, outputs unchanged bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from swiftlm.backends.attention import DenseAttention
from swiftlm.backends.cpu.backend import CpuBackend
from swiftlm.backends.cpu.host_memory import HUGE_PAGE
from swiftlm.backends.cpu.weight_arena import ALIGN, place_weights_in_arena, streaming_order
from swiftlm.backends.fuse import fuse_projections
from swiftlm.model.loader import load_model

PROMPT = [11, 2003, 57, 9000, 123, 42, 7, 150000, 64, 3]


@torch.inference_mode()
def logits_of(model: nn.Module, steps: int = 4) -> torch.Tensor:
    """Prefill PROMPT, then decode greedily one token at a time; every step's logits."""
    attention = DenseAttention(model.config.num_hidden_layers)
    new, start, seen = PROMPT, 0, []
    for _ in range(steps):
        logits = model.compute_logits(
            model(torch.tensor(new), torch.arange(start, start + len(new)), attention.bind(["r"], [len(new)])))
        seen.append(logits)
        start += len(new)
        new = [int(torch.argmax(logits[-1]))]
    return torch.cat(seen)


def streamed(model: nn.Module) -> list[torch.Tensor]:
    out = []
    for module in streaming_order(model):
        for name in ("weight", "bias", "qweight", "scales", "mins"):
            t = module._parameters.get(name, module._buffers.get(name))
            if t is not None:
                out.append(t)
    return out


def check_layout(model: nn.Module, size: int) -> None:
    tensors = streamed(model)
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
    base = tensors[0].data_ptr()  # the arena's start: the first layer's first weight
    assert base % HUGE_PAGE == 0
    offsets = [t.data_ptr() - base for t in tensors]
    assert all(o % ALIGN == 0 for o in offsets)
    assert max(o + t.numel() * t.element_size() for o, t in zip(offsets, tensors, strict=True)) <= size
    distinct = sorted(set(offsets), key=offsets.index)
    assert distinct == sorted(distinct), "tensors are not laid out in reading order"
    assert size >= sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in tensors}.values())


def in_fresh_buffers(model: nn.Module) -> nn.Module:
    """Every weight copied into a buffer of torch's allocator (64-byte aligned), ties kept.

    A checkpoint's tensors may start anywhere in its file. Some float32 GEMV libraries sum in
    another order when a weight does not start on 16 bytes (seen: torch's on a Zen4 CPU), so the
    reference logits come from weights aligned as the arena aligns them."""
    for param in model.parameters():  # a tied weight is one Parameter, listed once
        param.data = param.data.clone()
    return model


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_arena_keeps_outputs_and_ties(tiny_model_dir: Path, dtype: str) -> None:
    model = in_fresh_buffers(fuse_projections(load_model(tiny_model_dir, dtype)))
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    want = logits_of(model)
    arena = place_weights_in_arena(model)
    check_layout(model, arena.numel())
    assert place_weights_in_arena(model, arena) is arena  # already in place: nothing copied
    assert isinstance(model.model.embed_tokens.weight, nn.Parameter)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    assert torch.equal(logits_of(model), want)


@pytest.mark.parametrize("quantization", [None, "int8", "int4"])
def test_cpu_backend_puts_every_streamed_weight_in_the_arena(tiny_model_dir: Path, quantization: str | None) -> None:
    """The CPU backend's transformations (GEMV layers, quantised layers) end in one arena and give
    the same logits as the same transformations without it."""
    backend = CpuBackend()
    model = load_model(tiny_model_dir, "bfloat16")
    backend.prepare(model, quantization)
    check_layout(model, backend.weight_arena.numel())
    without = load_model(tiny_model_dir, "bfloat16")
    CpuBackend(kernels=backend.kernels, place_weights=False).prepare(without, quantization)
    assert len({t.untyped_storage().data_ptr() for t in streamed(without)}) > 1
    assert torch.equal(logits_of(model), logits_of(without))


def test_fusing_weights_that_lie_back_to_back_makes_a_view() -> None:
    """q/k/v (and gate/up) placed back to back in one buffer fuse without a copy; anything else
    (a gap, another buffer) is concatenated; both give the same fused weight."""
    from swiftlm.backends.fuse import _concat_linear

    buf = torch.randn(4 * 8 + 2 * 8 + 8, 16)  # three weights of 4, 2 and 2 rows of 16, and spare rows
    parts = []
    for lo, hi in ((0, 4), (4, 6), (6, 8)):
        linear = nn.Linear(16, hi - lo, bias=False)
        linear.weight = nn.Parameter(buf[lo:hi], requires_grad=False)
        parts.append(linear)
    fused = _concat_linear(*parts)
    assert fused.weight.data_ptr() == buf.data_ptr() and torch.equal(fused.weight, buf[:8])
    parts[2].weight = nn.Parameter(buf[7:9], requires_grad=False)  # a gap of one row
    gapped = _concat_linear(*parts)
    assert gapped.weight.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr()
    assert torch.equal(gapped.weight, torch.cat([buf[:6], buf[7:9]]))
