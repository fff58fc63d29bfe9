"""The decoder built from loaded tensors: the one last step of every checkpoint format."""

from __future__ import annotations

import torch

from swiftlm.config import ModelConfig
from swiftlm.model.decoder import DecoderForCausalLM


def assemble_model(config: ModelConfig, state: dict[str, torch.Tensor], device: str | torch.device) -> DecoderForCausalLM:
    """``DecoderForCausalLM(config)`` holding ``state`` (Hugging Face names, already of the served
    dtype and on ``device``): built on the meta device and the tensors assigned, so memory-mapped
    ones are used without a copy; the tied head shares the embedding; in eval mode, no grad."""
    with torch.device("meta"):
        model = DecoderForCausalLM(config)
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # Buffers (rotary tables) are computed, not loaded: rebuild them on the real device.
    rotary = type(model.model.rotary)(config.head_dim, config.max_position_embeddings, config.rope_theta,
                                      config.rope_scaling)
    model.model.rotary = rotary.to(device)
    model.eval().requires_grad_(False)
    return model
