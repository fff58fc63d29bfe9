"""All decoder layers of a small decode step in one C++ call (``kernels/decode_cpu.cpp``).

``fused_forward`` hands a step to ``DecodeLayers`` when the step is decode rows alone (the bound
attention offers a ``decode_only`` description of it: its pools, block tables and lengths, so the
op stores K/V and attends exactly as ``BoundPagedAttention`` would) and every linear of every layer
is a bias-free ``GemvLinear`` (bf16) or a bias-free ``QuantLinear`` on its kernels (int8 / int4),
all alike, taking that many rows through their kernels. The row limits come from the backend's
``RowLimits`` and are handed to the op. The op runs the same kernels in the same order as the Python
loop, so the hidden states and the KV pools come out bit for bit the same (the tests hold it to that);
what it saves is the Python work between the weight reads, each op of which starts with cold caches
after a GEMV has streamed its weights through them (see the C++ source for the measurements).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from swiftlm.backends.cpu.limits import RowLimits
from swiftlm.backends.cpu.linear import GemvLinear
from swiftlm.backends.qk_norm import qk_norm_weights
from swiftlm.backends.quant import QuantLinear

if TYPE_CHECKING:
    from swiftlm.backends.attention import DecodeOnlyStep
    from swiftlm.model.decoder import DecoderModel


KINDS = {"bf16": 0, "int8": 1, "int4": 2}  # the op's ``kind`` argument


def _kind(linear: nn.Module) -> tuple | None:
    """What decides the kernel a linear runs for a given number of rows, or None if the op cannot run it."""
    if isinstance(linear, GemvLinear) and linear.bias is None:
        return ("bf16", linear.gemv_max_rows, linear.amx_max_rows)
    if (isinstance(linear, QuantLinear) and linear.bias is None and linear._kernel_gemv is not None
            and linear.path == "auto"):
        return (linear.method, linear.kernel_max_rows)
    return None


class DecodeLayers:
    """The layers' tensors flattened once for the op: 8 weights (norms; bf16 linears) and 3 eps per
    layer, and for quantised layers 12 tensors (qweight, scales, mins or empty, per linear)."""

    def __init__(self, model: DecoderModel, op: Callable[..., torch.Tensor], limits: RowLimits) -> None:
        layers = list(model.layers)
        first = layers[0].self_attn
        self.op = op
        qkv = first.qkv_proj
        self.kind = KINDS[_kind(qkv)[0]]
        self.intermediate = layers[0].mlp.down_proj.in_features
        if isinstance(qkv, GemvLinear):
            # the rows the GEMV kernel takes, then AMX (when present); more rows take the dense matmul
            # in the Python loop
            self.gemv_max_rows = limits.gemv
            self.max_rows = limits.bf16_kernel_rows
        else:  # the quantised GEMV kernels
            self.gemv_max_rows = self.max_rows = limits.quant_gemv
        empty = torch.empty(0)
        self.quant: list[torch.Tensor] = []
        self.n_heads, self.n_kv_heads = first.n_heads, first.n_kv_heads
        self.scale = first.head_dim ** -0.5
        self.cos, self.sin = model.rotary.cos_cached, model.rotary.sin_cached  # [max_positions, Dh] float32
        self.weights: list[torch.Tensor] = []
        self.eps: list[float] = []
        for i, layer in enumerate(layers):
            attn, mlp = layer.self_attn, layer.mlp
            nxt = layers[i + 1].input_layernorm if i + 1 < len(layers) else model.norm
            linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
            if self.kind == KINDS["bf16"]:
                qkv_w, o_w, gu_w, down_w = (m.weight for m in linears)
            else:  # the op reads the quantised tensors; these slots are not read
                qkv_w = o_w = gu_w = down_w = empty
                for m in linears:
                    b = m._buffers
                    self.quant += [b["qweight"], b["scales"], b["mins"] if b["mins"] is not None else empty]
            q_norm, k_norm, qk_eps = qk_norm_weights(attn, model.embed_tokens.weight.dtype)  # empty: no q/k norm
            self.weights += [qkv_w, q_norm, k_norm, o_w, layer.post_attention_layernorm.weight, gu_w, down_w,
                             nxt.weight]
            self.eps += [qk_eps, layer.post_attention_layernorm.eps, nxt.eps]

    @staticmethod
    def supports(model: DecoderModel) -> str | None:
        """None when every layer has fused q/k/v and gate/up and all four linears are of one kind
        the op runs (bias-free GemvLinears, or bias-free QuantLinears of one method on their
        kernels), choosing their kernels alike; else why not."""
        kinds = set()
        for layer in model.layers:
            linears = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
            kinds |= {_kind(m) for m in linears}
        if None in kinds:
            return "a layer linear is not on swiftlm's bias-free GEMV or quantised kernels"
        if len(kinds) > 1:
            return "the layer linears choose their kernels differently"
        return None

    def __call__(
        self, residual: torch.Tensor, h: torch.Tensor, positions: torch.Tensor, step: DecodeOnlyStep
    ) -> torch.Tensor:
        """residual, h: [T, hidden] (residual updated in place) -> the final normed hidden [T, hidden]."""
        return self.op(residual, h, positions, step.slot_mapping, step.block_tables, step.seq_lens, self.weights,
                       step.k_pools, step.v_pools, self.cos, self.sin, self.n_heads, self.n_kv_heads, self.eps,
                       self.scale, self.gemv_max_rows, self.max_rows, self.kind, self.quant, self.intermediate,
                       step.k_scales, step.v_scales)
