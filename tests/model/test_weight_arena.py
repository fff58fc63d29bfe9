"""place_weights_in_arena: one buffer in reading order, ties kept, outputs unchanged bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from swiftlm.config import EngineConfig
from swiftlm.engine.engine import prepare_model
from swiftlm.host_memory import HUGE_PAGE
from swiftlm.model.fuse import fuse_projections
from swiftlm.model.loader import load_model
from swiftlm.model.weight_arena import ALIGN, place_weights_in_arena, streaming_order
from swiftlm.runner.attention import DenseAttention

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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_arena_keeps_outputs_and_ties(tiny_model_dir: Path, dtype: str) -> None:
    model = fuse_projections(load_model(tiny_model_dir, dtype))
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    want = logits_of(model)
    size = place_weights_in_arena(model)
    check_layout(model, size)
    assert isinstance(model.model.embed_tokens.weight, nn.Parameter)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    assert torch.equal(logits_of(model), want)


@pytest.mark.parametrize("quantization", [None, "int8", "int4"])
def test_engine_preparation_puts_every_streamed_weight_in_the_arena(
    tiny_model_dir: Path, quantization: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's own transformations (GEMV layers, quantised layers) end in one arena and give
    the same logits as the same transformations without it."""
    config = EngineConfig(model=str(tiny_model_dir), dtype="bfloat16", quantization=quantization)
    model = load_model(tiny_model_dir, "bfloat16")
    prepare_model(model, config)
    check_layout(model, streamed(model)[0].untyped_storage().nbytes())  # an upper bound here
    with monkeypatch.context() as m:
        m.setattr("swiftlm.engine.engine.place_weights_in_arena", lambda model: 0)
        without = load_model(tiny_model_dir, "bfloat16")
        prepare_model(without, config)
    assert len({t.untyped_storage().data_ptr() for t in streamed(without)}) > 1
    assert torch.equal(logits_of(model), logits_of(without))


def test_fusing_weights_that_lie_back_to_back_makes_a_view() -> None:
    """q/k/v (and gate/up) placed back to back in one buffer fuse without a copy; anything else
    (a gap, another buffer) is concatenated; both give the same fused weight."""
    from swiftlm.model.fuse import _concat_linear

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
