"""``fuse_projections``: q/k/v and gate/up concatenated into single matmuls, a transformation of a
built model (the model file stays one model) that any backend may apply. Results equal the plain
model up to float rounding (tests compare greedy tokens in float32).
"""

from __future__ import annotations

from itertools import pairwise

import torch
from torch import nn

from swiftlm.model.decoder import DecoderForCausalLM


def _adjacent(tensors: list[torch.Tensor]) -> bool:
    """Contiguous tensors of one dtype and row width lying back to back in one storage."""
    storage = tensors[0].untyped_storage().data_ptr()
    for a, b in pairwise(tensors):
        if not (a.is_contiguous() and b.is_contiguous() and a.dtype == b.dtype and a.shape[1:] == b.shape[1:]
                and a.untyped_storage().data_ptr() == storage == b.untyped_storage().data_ptr()
                and a.data_ptr() + a.numel() * a.element_size() == b.data_ptr()):
            return False
    return True


def _concat_linear(*parts: nn.Linear) -> nn.Linear:
    """One linear for ``parts`` stacked by output features. When their weights already lie back to
    back (the CPU backend's weight arena places them so, ``backends/cpu/prepare.py``), the fused weight is a view
    of that memory: no copy, no fresh memory to touch at load."""
    out_features = sum(p.out_features for p in parts)
    with torch.device("meta"):  # no random initialisation of weights that are overwritten anyway
        fused = nn.Linear(parts[0].in_features, out_features, bias=parts[0].bias is not None)
    weights = [p.weight.detach() for p in parts]
    if _adjacent(weights):
        w = weights[0]
        weight = w.as_strided((out_features, w.shape[1]), (w.shape[1], 1))
    else:
        weight = torch.cat(weights)
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if parts[0].bias is not None:
        fused.bias = nn.Parameter(torch.cat([p.bias.detach() for p in parts]), requires_grad=False)
    return fused


def fuse_projections(model: DecoderForCausalLM) -> DecoderForCausalLM:
    """q/k/v and gate/up concatenated into one linear each (new tensors in process memory)."""
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if attn.qkv_proj is None:
            attn.qkv_proj = _concat_linear(attn.q_proj, attn.k_proj, attn.v_proj)
            del attn.q_proj, attn.k_proj, attn.v_proj
        if mlp.gate_up_proj is None:
            mlp.gate_up_proj = _concat_linear(mlp.gate_proj, mlp.up_proj)
            del mlp.gate_proj, mlp.up_proj
    return model
