"""A backend's step plan: the Qwen3 forward pass over fused elementwise ops (``FusedOps``: the CPU
backend's ``cpu/kernels/fused_cpu.py``, the CUDA backend's ``cuda/kernels/fused_ops.py``).

The same computation as ``DecoderModel.forward`` (the tests hold it to that), arranged for fewer
Python steps per token: each residual add is folded into the norm that follows it (the residual
stream is updated in place and every layer hands the next its normed input), q/k norm and rotary
are one op, SiLU-and-multiply one op, and every layer's tensors and linear ``forward`` methods are
looked up once into a ``LayerPlan`` instead of through ~20 module attribute accesses a layer. The
plan is built by the backend's ``prepare`` after every transformation that replaces modules, and
names the modules present then. On the CPU, decode-only steps of up to ``DecodeLayers.max_rows``
rows run this loop in C++ when the plan holds a ``DecodeLayers`` (``cpu/decode.py``); the step's
attention offers them through its ``decode_only`` description (``backends/attention.py``). On CUDA
the loop is what the decode graphs capture: ~10 kernels a layer instead of ~45.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from swiftlm.backends.qk_norm import qk_norm_weights

if TYPE_CHECKING:
    from swiftlm.backends.attention import BoundAttention
    from swiftlm.backends.cpu.decode import DecodeLayers
    from swiftlm.model.decoder import DecoderModel

Linear = Callable[[torch.Tensor], torch.Tensor]
FUSED_DTYPES = (torch.float32, torch.bfloat16)  # the activation dtypes every FusedOps takes


def fused_ops_support(dtype: torch.dtype, head_dim: int) -> str | None:
    """None if fused ops (of either backend) run a model of this activation dtype and head_dim,
    else why not."""
    if dtype not in FUSED_DTYPES:
        return f"{str(dtype).removeprefix('torch.')} activations (the fused ops take float32 or bfloat16)"
    if head_dim % 2:
        return f"head_dim {head_dim} is odd (rotary pairs halves)"
    return None


@dataclass(frozen=True, slots=True)
class FusedOps:
    """The elementwise steps of a layer as single ops, each repeating the rounding steps of the plain
    torch code of ``swiftlm.model.layers`` (float32 math, a rounding to the activation dtype wherever
    torch would produce a tensor of that dtype):

    * ``rms_norm(x [T, D], w [D], eps) -> [T, D]``: ``w * dtype(x * rsqrt(mean(x^2) + eps))``;
    * ``add_rms_norm_(residual [T, D], delta [T, D], w, eps) -> [T, D]``: ``residual = dtype(residual
      + delta)`` in place, then ``rms_norm(residual)``;
    * ``qk_norm_rope(qkv [T, (Hq + 2 Hk) * Dh], q_w [Dh], k_w [Dh], cos [P, Dh], sin [P, Dh] (float32),
      positions [T] int64, Hq, Hk, eps) -> (q [T, Hq, Dh], k [T, Hk, Dh])``: each head normed (empty
      weights: not normed), then rotated (half-split) by ``dtype(cos[pos])``, ``dtype(sin[pos])``;
    * ``silu_mul(gate_up [T, 2 I]) -> [T, I]``: ``dtype(dtype(silu(gate)) * up)``;
    * ``greedy_pick(logits [B, V] float32) -> (ids [B] int64, finite [B] bool)``: each row's argmax
      (the lowest id among tied ones) and whether all its logits are finite."""

    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    add_rms_norm_: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
    qk_norm_rope: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    silu_mul: Callable[[torch.Tensor], torch.Tensor]
    greedy_pick: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

    def __deepcopy__(self, memo: dict) -> FusedOps:
        return self  # stateless; models holding it can be deep-copied


@dataclass(frozen=True, slots=True)
class LayerPlan:
    index: int
    qkv: Linear  # [T, hidden] -> [T, (Hq + 2 Hk) * Dh]
    q_norm: torch.Tensor  # [Dh], or empty: the model has no q/k norm (Llama, Qwen2)
    k_norm: torch.Tensor
    qk_eps: float
    n_heads: int
    n_kv_heads: int
    head_dim: int
    o_proj: Linear
    post_norm: torch.Tensor
    post_eps: float
    gate_up: Linear  # [T, hidden] -> [T, 2 * intermediate]
    down: Linear
    next_norm: torch.Tensor  # the next layer's input norm, or the final norm
    next_eps: float


def _concat(*parts: Linear) -> Linear:
    return lambda x: torch.cat([p(x) for p in parts], dim=-1)


def build_plan(model: DecoderModel) -> list[LayerPlan]:
    plans = []
    layers = list(model.layers)
    for i, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        nxt = layers[i + 1].input_layernorm if i + 1 < len(layers) else model.norm
        qkv = attn.qkv_proj.forward if attn.qkv_proj is not None else _concat(
            attn.q_proj.forward, attn.k_proj.forward, attn.v_proj.forward)
        gate_up = mlp.gate_up_proj.forward if mlp.gate_up_proj is not None else _concat(
            mlp.gate_proj.forward, mlp.up_proj.forward)
        q_norm, k_norm, qk_eps = qk_norm_weights(attn, model.embed_tokens.weight.dtype)
        plans.append(LayerPlan(
            index=attn.layer, qkv=qkv, q_norm=q_norm, k_norm=k_norm, qk_eps=qk_eps,
            n_heads=attn.n_heads, n_kv_heads=attn.n_kv_heads, head_dim=attn.head_dim, o_proj=attn.o_proj.forward,
            post_norm=layer.post_attention_layernorm.weight, post_eps=layer.post_attention_layernorm.eps,
            gate_up=gate_up, down=mlp.down_proj.forward, next_norm=nxt.weight, next_eps=nxt.eps,
        ))
    return plans


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What ``fused_forward`` runs: the layers' plans, the fused ops, and the decode layers op
    for small decode-only steps (None where it cannot run this model)."""

    layers: list[LayerPlan]
    ops: FusedOps
    decode_layers: DecodeLayers | None


def fused_forward(
    model: DecoderModel, plan: StepPlan, input_ids: torch.Tensor, positions: torch.Tensor, attention: BoundAttention,
) -> torch.Tensor:
    """input_ids, positions: [T] -> final hidden states [T, hidden] (normed, as DecoderModel.forward)."""
    ops = plan.ops
    residual = model.embed_tokens(input_ids)  # [T, hidden], a fresh tensor: updated in place below
    first = model.layers[0].input_layernorm
    h = ops.rms_norm(residual, first.weight, first.eps)
    decode = plan.decode_layers
    if decode is not None and h.shape[0] <= decode.max_rows:
        step = attention.decode_only  # a DecodeOnlyStep when the step is decode rows alone, else None
        if step is not None:
            return decode(residual, h, positions, step)  # the same loop, in C++
    cos, sin = model.rotary.cos_cached, model.rotary.sin_cached  # [max_positions, Dh] float32
    t = h.shape[0]
    for p in plan.layers:
        qkv = p.qkv(h)
        q, k = ops.qk_norm_rope(qkv, p.q_norm, p.k_norm, cos, sin, positions, p.n_heads, p.n_kv_heads, p.qk_eps)
        # v: the last Hk * Dh columns of each row, viewed as [T, Hk, Dh] (no copy)
        v = qkv[:, (p.n_heads + p.n_kv_heads) * p.head_dim :].reshape(t, p.n_kv_heads, p.head_dim)
        a = p.o_proj(attention(p.index, q, k, v).reshape(t, p.n_heads * p.head_dim))
        h = ops.add_rms_norm_(residual, a, p.post_norm, p.post_eps)
        m = p.down(ops.silu_mul(p.gate_up(h)))
        h = ops.add_rms_norm_(residual, m, p.next_norm, p.next_eps)
    return h
