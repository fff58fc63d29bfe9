"""Transformations of a built model for fast inference (the model file stays one model).

``fuse_projections`` concatenates q/k/v and gate/up into single matmuls; ``pack_linears`` lays
every linear's weight out once for oneDNN's matmul, which streams bf16 weights about three times
faster than ``F.linear`` at one row on AVX-512 CPUs. Both keep results equal to the plain model
up to float rounding (tests compare greedy tokens in float32).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from itertools import pairwise

import torch
from torch import nn

from swiftlm.kernels.fused_cpu import FusedOps
from swiftlm.model.qwen3 import Qwen3ForCausalLM

logger = logging.getLogger(__name__)


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
    back (the weight arena places them so, ``engine.prepare_model``), the fused weight is a view
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


def fuse_projections(model: Qwen3ForCausalLM) -> Qwen3ForCausalLM:
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


class PackedLinear(nn.Module):
    """A linear layer whose weight oneDNN has reordered once into its blocked layout."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, 1), persistent=False)
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.nbytes = weight.numel() * weight.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, shape[-1]), self.packed_weight, self.bias, "none", [], "")
        return y.reshape(*shape[:-1], self.out_features)


def can_pack(dtype: torch.dtype, device: str) -> bool:
    return device == "cpu" and torch.backends.mkldnn.is_available() and dtype in (torch.bfloat16, torch.float32)


def pack_linears(model: nn.Module) -> int:
    """Replace every nn.Linear by a PackedLinear; returns how many were packed. The tied
    lm_head gets its own packed copy while the embedding keeps the plain table for lookups."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, PackedLinear(child))
                count += 1
    return count


def use_fused_ops(model: Qwen3ForCausalLM, ops: FusedOps) -> None:
    """Run the layers' norms, rotary and SiLU-multiply as the fused ops ``ops`` from now on."""
    model.model.fused_ops = ops
    model.model.fused_plan = None  # rebuilt from the modules present at the next forward


def use_decode_layers(model: Qwen3ForCausalLM, op: Callable[..., torch.Tensor]) -> None:
    """Run small decode-only steps through ``op`` (``kernels/decode_cpu.py``) when the model's
    layers allow it (``DecodeLayers.supports``, checked with the fused plan at the next forward)."""
    model.model.decode_op = op
    model.model.fused_plan = None
