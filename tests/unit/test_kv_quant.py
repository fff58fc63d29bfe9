"""The small KV cache's reference quantisation (backends/kv_quant.py) and what it does to the pool size."""

from __future__ import annotations

import pytest
import torch

from swiftlm.backends.kv_cache import KVCache, bytes_per_block, num_blocks_for
from swiftlm.backends.kv_quant import dequantize_kv, kv_format, quantize_kv
from swiftlm.config import CacheConfig, ConfigError, ModelConfig

FORMATS = ["int8", "fp8_e4m3", "fp8_e5m2"]
# worst relative error of a value against its row's amax: half a step of int8 (1/254), and of
# float8's mantissa at the top of the range (e4m3 3 bits: 1/16; e5m2 2 bits: 1/8)
REL_ERR = {"int8": 1 / 254, "fp8_e4m3": 1 / 16, "fp8_e5m2": 1 / 8}


def model_config() -> ModelConfig:
    return ModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, vocab_size=100, max_position_embeddings=256)


@pytest.mark.parametrize("name", FORMATS)
def test_round_trip_error_is_bounded_by_the_row_scale(name: str) -> None:
    fmt = kv_format(name)
    x = torch.randn(64, 4, 128, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 2, 64).view(64, 1, 1)
    q, s = quantize_kv(x, fmt)
    assert q.dtype == fmt.storage and s.dtype == torch.float32 and s.shape == (64, 4)
    back = dequantize_kv(q, s, torch.float32)
    amax = x.abs().amax(-1, keepdim=True)
    assert ((back - x).abs() <= amax * REL_ERR[name] * 1.001).all()
    # the largest value of each row is represented exactly (it is the scale's qmax)
    top = x.abs().argmax(-1, keepdim=True)
    torch.testing.assert_close(back.gather(-1, top).abs(), amax, rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", FORMATS)
def test_zero_rows_and_bf16_input(name: str) -> None:
    fmt = kv_format(name)
    x = torch.zeros(3, 2, 16, dtype=torch.bfloat16)
    x[1, 1, 5] = -2.5
    q, s = quantize_kv(x, fmt)
    assert torch.equal(s[0], torch.ones(2)) and s[1, 1] == 2.5 / fmt.qmax
    back = dequantize_kv(q, s, torch.bfloat16)
    assert torch.equal(back, x)


def test_names_and_errors() -> None:
    assert kv_format("auto") is None
    assert kv_format("fp8") == kv_format("fp8_e4m3")
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        kv_format("fp4")
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        CacheConfig(kv_cache_dtype="int4")


def test_eight_bit_cache_holds_about_twice_the_tokens() -> None:
    cfg = model_config()
    plain = bytes_per_block(cfg, 16, torch.bfloat16)
    small = bytes_per_block(cfg, 16, torch.bfloat16, kv_format("int8"))
    assert plain == 2 * 2 * 2 * 16 * 16 * 2 and small == 2 * 2 * 2 * 16 * (16 + 4)
    budget = 50 * plain
    n_plain = num_blocks_for(cfg, CacheConfig(kv_cache_memory=budget), torch.bfloat16, 10**9)
    n_small = num_blocks_for(cfg, CacheConfig(kv_cache_memory=budget, kv_cache_dtype="fp8"), torch.bfloat16, 10**9)
    assert n_plain == 50 and n_small == budget // small == 80


@pytest.mark.parametrize("name", FORMATS)
def test_cache_stores_gathers_and_copies_blocks(name: str) -> None:
    cfg = model_config()
    cache = KVCache(cfg, num_blocks=6, block_size=4, dtype=torch.float32, fmt=kv_format(name))
    k, v = torch.randn(5, 2, 16), torch.randn(5, 2, 16)
    slots = torch.tensor([4, 5, 6, 7, 8])  # block 1 whole, then block 2's first slot
    cache.store(1, slots, k, v)
    k_blocks, v_blocks = cache.gather(1, torch.tensor([1, 2]))
    assert k_blocks.shape == (2, 4, 2, 16) and k_blocks.dtype == torch.float32
    qk, sk = quantize_kv(k, cache.fmt)
    torch.testing.assert_close(k_blocks.reshape(-1, 2, 16)[:5], dequantize_kv(qk, sk, torch.float32), rtol=0, atol=0)
    assert (k_blocks.reshape(-1, 2, 16)[:5] - k).abs().max() <= k.abs().max() * REL_ERR[name]
    cache.copy_block(1, 3)
    k3, v3 = cache.gather(1, torch.tensor([3]))
    assert torch.equal(k3[0], k_blocks[0]) and torch.equal(v3[0], v_blocks[0])
    untouched, _ = cache.gather(0, torch.tensor([1]))
    assert torch.equal(untouched, torch.zeros_like(untouched))
