"""The KV pool on a CUDA device: the share of its memory (vLLM's 0.9 by default) less the weights
and the measured activation peak of a profiled step (device memory queries faked: no GPU here)."""

from __future__ import annotations

import pytest
import torch

from swiftlm.backends.kv_cache import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    GPU_ACTIVATION_RESERVE,
    bytes_per_block,
    gpu_kv_budget,
    num_blocks_for,
)
from swiftlm.config import CacheConfig, ModelConfig

GIB = 1024**3
MODEL = ModelConfig(vocab_size=1000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                    num_attention_heads=16, num_key_value_heads=8, head_dim=128)
TOTAL, WEIGHTS = 80 * GIB, 2 * GIB


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (TOTAL - WEIGHTS, TOTAL))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: WEIGHTS)
    return "cuda:0"


def test_the_measured_activation_peak_replaces_the_fixed_reserve(device: str) -> None:
    cache = CacheConfig(gpu_memory_utilization=0.5, block_size=16)
    per_block = bytes_per_block(MODEL, cache.block_size, torch.bfloat16)
    measured = 3 * GIB
    n = num_blocks_for(MODEL, cache, torch.bfloat16, 1024, device, activation_bytes=measured)
    assert n == (int(TOTAL * 0.5) - WEIGHTS - measured) // per_block
    fixed = num_blocks_for(MODEL, cache, torch.bfloat16, 1024, device)
    assert fixed == gpu_kv_budget(0.5, TOTAL, TOTAL - WEIGHTS, WEIGHTS, GPU_ACTIVATION_RESERVE) // per_block
    assert fixed - n == (measured - GPU_ACTIVATION_RESERVE) // per_block


def test_without_a_share_the_device_gets_vllms_default(device: str) -> None:
    per_block = bytes_per_block(MODEL, 16, torch.bfloat16)
    n = num_blocks_for(MODEL, CacheConfig(), torch.bfloat16, 1024, device, activation_bytes=GIB)
    assert DEFAULT_GPU_MEMORY_UTILIZATION == 0.9
    assert n == (int(TOTAL * 0.9) - WEIGHTS - GIB) // per_block  # not capped by the host's 2 GiB default
    with pytest.raises(ValueError, match="leaves no room for a KV cache"):
        num_blocks_for(MODEL, CacheConfig(gpu_memory_utilization=0.05), torch.bfloat16, 1024, device,
                       activation_bytes=2 * GIB)
