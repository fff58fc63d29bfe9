"""One buffer for the weights a decode step streams, laid out in the order a token reads them.

Batch-1 decode reads every linear weight once per token, so its speed is the rate at which the
weights stream from memory, and that rate depends on where they sit. Measured on a 2-core Xeon
VM, the 112 layer linears of the Qwen3-0.6B shape at one row (bf16 GEMV kernel), same process,
interleaved: the weights as loaded (fused copies and clones made during loading, one allocation
each) streamed at 8-11 GB/s; separate fresh clones at 13.5-16 GB/s; the same bytes in one
buffer at 16-18.6 GB/s, and on 2 MiB pages faster again (see ``swiftlm.backends.cpu.host_memory``).
``place_weights_in_arena`` copies them into one huge-page allocation, each tensor 4 KiB aligned,
in the order of the forward pass (per layer q/k/v, o, gate/up, down;
then the lm_head and the embedding table), and points the modules at views of it. One copy at
load replaces the clones that took the weights out of the checkpoint's file mapping.
"""

from __future__ import annotations

import torch
from torch import nn

from swiftlm.backends.cpu.host_memory import huge_page_buffer
from swiftlm.model.decoder import DecoderForCausalLM

ALIGN = 4096  # bytes; every tensor starts on its own page
# the tensors of a linear layer that its forward reads (GemvLinear, nn.Linear, QuantLinear);
# oneDNN's packed weights keep their own allocation (an opaque layout)
_STREAMED = ("weight", "bias", "qweight", "scales", "mins")


def streaming_order(model: DecoderForCausalLM) -> list[nn.Module]:
    """The modules whose weights a decode step reads, in the order it reads them."""
    modules: list[nn.Module] = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        modules += [attn.qkv_proj] if attn.qkv_proj is not None else [attn.q_proj, attn.k_proj, attn.v_proj]
        modules.append(attn.o_proj)
        modules += [mlp.gate_up_proj] if mlp.gate_up_proj is not None else [mlp.gate_proj, mlp.up_proj]
        modules.append(mlp.down_proj)
    modules += [model.lm_head, model.model.embed_tokens]
    return modules


def _key(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), t.dtype, tuple(t.shape))


def _in_place(arena: torch.Tensor | None, tensors: list[torch.Tensor]) -> bool:
    """Every tensor already inside ``arena``, in reading order."""
    if arena is None or not tensors:
        return False
    lo, hi = arena.data_ptr(), arena.data_ptr() + arena.numel()
    starts = [t.data_ptr() for t in tensors]
    inside = all(lo <= a and a + t.numel() * t.element_size() <= hi for a, t in zip(starts, tensors, strict=True))
    distinct = sorted(set(starts), key=starts.index)
    return inside and distinct == sorted(distinct)


def place_weights_in_arena(model: DecoderForCausalLM, arena: torch.Tensor | None = None) -> torch.Tensor | None:
    """Move the streamed weights of ``model`` (CPU) into one buffer; returns that buffer (None when
    there was nothing to place). The caller keeps it alive as long as the model.

    Tensors that share memory (the tied lm_head and embedding) keep sharing it. Nothing is copied
    when ``arena``, an earlier call's buffer, already holds every streamed tensor in reading order
    (q/k/v and gate/up fused since then as views of it, see ``backends/fuse.py``).
    """
    slots: list[tuple[nn.Module, str, bool, torch.Tensor]] = []  # (module, name, is_parameter, tensor)
    offsets: dict[tuple, int] = {}
    total = 0
    for module in streaming_order(model):
        for store, is_param in ((module._parameters, True), (module._buffers, False)):
            for name in _STREAMED:
                t = store.get(name)
                if t is None or t.device.type != "cpu" or t.layout != torch.strided or not t.is_contiguous():
                    continue
                slots.append((module, name, is_param, t))
                if _key(t) not in offsets:
                    offsets[_key(t)] = total
                    total += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    if not slots:
        return None
    if _in_place(arena, [t for *_, t in slots]):
        return arena
    arena = huge_page_buffer(total)
    views: dict[tuple, torch.Tensor] = {}  # memory -> its copy in the arena, made at first sight
    params: dict[tuple, nn.Parameter] = {}
    with torch.no_grad():
        for module, name, is_param, t in slots:
            key = _key(t)
            if key not in views:
                nbytes = t.numel() * t.element_size()
                views[key] = arena[offsets[key] : offsets[key] + nbytes].view(t.dtype).view(t.shape)
                views[key].copy_(t)
            if is_param:
                module._parameters[name] = params.setdefault(key, nn.Parameter(views[key], requires_grad=False))
            else:
                module._buffers[name] = views[key]
    return arena
