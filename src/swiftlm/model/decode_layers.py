"""All decoder layers of a small decode step in one C++ call (``kernels/decode_cpu.cpp``).

``fused_forward`` hands a step to ``DecodeLayers`` when the step is decode rows alone (the bound
attention offers a ``decode_only`` description of it) and every linear of every layer is a bias-free
``GemvLinear`` taking that many rows. The op runs the same kernels in the same order as the Python
loop, so the hidden states and the KV pools come out bit for bit the same (the tests hold it to that);
what it saves is the Python work between the weight reads, each op of which starts with cold caches
after a GEMV has streamed its weights through them (see the C++ source for the measurements).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from swiftlm.model.cpu_linear import GemvLinear

if TYPE_CHECKING:
    from swiftlm.model.qwen3 import Qwen3Model
    from swiftlm.runner.attention import DecodeOnlyStep


class DecodeLayers:
    """The layers' tensors flattened once for the op: 8 weights and 3 eps per layer."""

    def __init__(self, model: Qwen3Model, op: Callable[..., torch.Tensor]) -> None:
        layers = list(model.layers)
        first = layers[0].self_attn
        self.op = op
        # the rows the layers' GemvLinears run through the GEMV kernel, then through AMX (when they
        # have it); more rows take the dense matmul in the Python loop
        qkv: GemvLinear = first.qkv_proj
        self.gemv_max_rows = qkv.gemv_max_rows
        self.max_rows = GemvLinear.AMX_MAX_ROWS if qkv.amx is not None else qkv.gemv_max_rows
        self.n_heads, self.n_kv_heads = first.n_heads, first.n_kv_heads
        self.scale = first.head_dim ** -0.5
        self.cos, self.sin = model.rotary.cos_cached, model.rotary.sin_cached  # [max_positions, Dh] float32
        self.weights: list[torch.Tensor] = []
        self.eps: list[float] = []
        for i, layer in enumerate(layers):
            attn, mlp = layer.self_attn, layer.mlp
            nxt = layers[i + 1].input_layernorm if i + 1 < len(layers) else model.norm
            self.weights += [attn.qkv_proj.weight, attn.q_norm.weight, attn.k_norm.weight, attn.o_proj.weight,
                             layer.post_attention_layernorm.weight, mlp.gate_up_proj.weight, mlp.down_proj.weight,
                             nxt.weight]
            self.eps += [attn.q_norm.eps, layer.post_attention_layernorm.eps, nxt.eps]

    @staticmethod
    def supports(model: Qwen3Model) -> bool:
        """Every layer with fused q/k/v and gate/up, all four linears bias-free GemvLinears that
        choose their kernels alike."""
        kinds = set()
        for layer in model.layers:
            linears = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
            if not all(isinstance(m, GemvLinear) and m.bias is None for m in linears):
                return False
            kinds |= {(m.gemv_max_rows, m.amx is not None) for m in linears}
        return len(kinds) == 1

    def __call__(
        self, residual: torch.Tensor, h: torch.Tensor, positions: torch.Tensor, step: DecodeOnlyStep
    ) -> torch.Tensor:
        """residual, h: [T, hidden] (residual updated in place) -> the final normed hidden [T, hidden]."""
        return self.op(residual, h, positions, step.slot_mapping, step.block_tables, step.seq_lens, self.weights,
                       step.k_pools, step.v_pools, self.cos, self.sin, self.n_heads, self.n_kv_heads, self.eps,
                       self.scale, self.gemv_max_rows)
