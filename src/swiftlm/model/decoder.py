"""The dense decoder of Qwen3, Qwen2 and Llama over a flat batch of tokens.

The three differ by switches of ``ModelConfig``: Qwen3 norms each q and k head (``qk_norm``),
Qwen2 has q/k/v biases (``qkv_bias``), Llama may scale its rotary frequencies (``rope_scaling``);
each may tie its head to the embedding.

All scheduled tokens of all requests in a step are concatenated into one sequence of ``T`` tokens;
``positions`` gives each token's absolute position in its own request. Attention is the only
operation that needs to know where one request ends and the next begins, so it is delegated to an
``Attention`` callable bound to the step's metadata (see ``swiftlm.backends.attention``). Parameter
names equal the Hugging Face checkpoint names, so a checkpoint loads without renaming.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from swiftlm.config import ModelConfig
from swiftlm.model.layers import RMSNorm, RotaryEmbedding, SwiGLU, apply_rotary


class Attention(Protocol):
    """Attention for one step: causal within each request, over that request's cached context."""

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [T, n_heads, head_dim]; k, v: [T, n_kv_heads, head_dim] (this step's new tokens).

        Stores k and v in the layer's cache, then returns [T, n_heads, head_dim].
        """
        ...


class DecoderAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        qkv_bias = config.attention_bias or config.qkv_bias
        self.q_proj = nn.Linear(config.hidden_size, config.q_size, bias=qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, config.kv_size, bias=qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, config.kv_size, bias=qkv_bias)
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=config.attention_bias)
        # Qwen3 only: an RMSNorm over each q and k head before the rotary embedding
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.qkv_proj: nn.Module | None = None  # q, k and v in one matmul (see backends/fuse.py)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], attention: Attention
    ) -> torch.Tensor:
        t = x.shape[0]
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj(x).split([self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim,
                                              self.n_kv_heads * self.head_dim], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.reshape(t, self.n_heads, self.head_dim)
        k = k.reshape(t, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        v = v.reshape(t, self.n_kv_heads, self.head_dim)
        q, k = apply_rotary(q, k, rope)
        out = attention(self.layer, q, k, v)  # [T, n_heads, head_dim]
        return self.o_proj(out.reshape(t, self.n_heads * self.head_dim))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(config, layer)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], attention: Attention
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, attention)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        # _weight: no random init, every weight comes from a checkpoint (and nn.Embedding's normal_
        # on the meta device would import torch._dynamo: ~1.5 s of start-up)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta,
                                      config.rope_scaling)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Attention) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # [T, hidden]
        rope = self.rotary.table(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, rope, attention)
        return self.norm(x)


class DecoderForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Attention) -> torch.Tensor:
        """input_ids, positions: [T] -> final hidden states [T, hidden]."""
        return self.model(input_ids, positions, attention)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [S, hidden] for the S positions that sample -> float32 logits [S, vocab]."""
        return self.lm_head(hidden).float()


def expected_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint for ``config`` must hold, by its Hugging Face name."""
    h, d = config.hidden_size, config.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (config.q_size, h),
                p + "self_attn.k_proj.weight": (config.kv_size, h),
                p + "self_attn.v_proj.weight": (config.kv_size, h),
                p + "self_attn.o_proj.weight": (h, config.q_size),
                p + "mlp.gate_proj.weight": (config.intermediate_size, h),
                p + "mlp.up_proj.weight": (config.intermediate_size, h),
                p + "mlp.down_proj.weight": (h, config.intermediate_size),
            }
        )
        if config.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
        if config.attention_bias or config.qkv_bias:
            shapes[p + "self_attn.q_proj.bias"] = (config.q_size,)
            shapes[p + "self_attn.k_proj.bias"] = (config.kv_size,)
            shapes[p + "self_attn.v_proj.bias"] = (config.kv_size,)
        if config.attention_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
    return shapes
