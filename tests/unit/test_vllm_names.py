"""vLLM's names in the offline API: LLM's constructor arguments (``engine_config``), SamplingParams'
fields, and how the KV pool is sized from ``gpu_memory_utilization``."""

from __future__ import annotations

import dataclasses
import logging
import re

import pytest
import torch

from swiftlm.backends import kv_cache
from swiftlm.backends.kv_cache import GPU_ACTIVATION_RESERVE, bytes_per_block, gpu_kv_budget, num_blocks_for
from swiftlm.config import CacheConfig, ConfigError, EngineConfig, ModelConfig, SchedulerConfig, ServerConfig
from swiftlm.llm import VLLM_NO_OPS, engine_config
from swiftlm.sampling import VLLM_UNSUPPORTED, SamplingParams

# LLM(...) as the articles write it (002's offline snippet)
ARTICLE_KWARGS = dict(
    enable_reasoning=True, reasoning_parser="deepseek_r1", gpu_memory_utilization=0.82, max_model_len=8192,
    block_size=32,
)
GIB = 1024**3


def test_the_articles_llm_arguments_map_onto_the_configs() -> None:
    cfg = engine_config("Qwen/Qwen3-0.6B", **ARTICLE_KWARGS)
    assert cfg.cache == CacheConfig(block_size=32, gpu_memory_utilization=0.82)
    assert cfg.scheduler == SchedulerConfig(max_model_len=8192)
    assert dataclasses.replace(cfg, cache=CacheConfig(), scheduler=SchedulerConfig()) == EngineConfig("Qwen/Qwen3-0.6B")


def test_vllm_no_op_and_fixed_arguments_are_accepted() -> None:
    plain = engine_config("m", max_num_seqs=4)
    with_vllm = engine_config(
        "m", max_num_seqs=4, tensor_parallel_size=1, pipeline_parallel_size=1, enforce_eager=True, swap_space=4,
        trust_remote_code=True, tokenizer="m", tokenizer_mode="auto", disable_log_stats=True, cpu_offload_gb=0,
        revision=None, num_scheduler_steps=1, max_seq_len_to_capture=8192,
    )  # fmt: skip
    assert with_vllm.enforce_eager  # it reaches the CUDA backend (no decode graphs)
    assert dataclasses.replace(with_vllm, enforce_eager=False) == plain


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tensor_parallel_size": 2}, "tensor_parallel_size must be 1 here: one device per replica"),
        ({"pipeline_parallel_size": 4}, "pipeline_parallel_size must be 1"),
        ({"reasoning_parser": "granite"}, "reasoning_parser must be one of qwen3, deepseek_r1, none"),
        ({"tokenizer": "other/tokenizer"}, "swiftlm loads the tokenizer from the model directory"),
        ({"cpu_offload_gb": 2}, "cpu_offload_gb must be 0"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization must be in (0, 1]"),
    ],
)
def test_vllm_arguments_swiftlm_cannot_honour_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        engine_config("m", **kwargs)


def test_an_unknown_argument_fails_naming_the_known_ones() -> None:
    with pytest.raises(TypeError, match="unknown engine arguments: max_modle_len; known: ") as info:
        engine_config("m", max_modle_len=8192)
    known = str(info.value).split("known: ")[1].split(", ")
    for name in ("max_model_len", "block_size", "gpu_memory_utilization", "reasoning_parser", *VLLM_NO_OPS):
        assert name in known


def test_unmet_vllm_arguments_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="swiftlm"):
        engine_config("m", swap_space=4, num_scheduler_steps=4, enforce_eager=True, **ARTICLE_KWARGS)
    lines = [r.getMessage() for r in caplog.records if "no effect" in r.getMessage()]
    assert len(lines) == 1
    for name in ("swap_space", "num_scheduler_steps", "gpu_memory_utilization"):
        assert name in lines[0]
    assert "enforce_eager" not in lines[0]  # eager is what runs
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="swiftlm"):
        engine_config("m", device="cuda", gpu_memory_utilization=0.82, num_scheduler_steps=1)
    assert not [r for r in caplog.records if "no effect" in r.getMessage()]


def test_vllm_dtype_names() -> None:
    assert engine_config("m", dtype="half").dtype == "float16"
    assert engine_config("m", dtype="float").dtype == "float32"
    assert engine_config("m", dtype="bfloat16").dtype == "bfloat16"


# -- the KV pool under gpu_memory_utilization -----------------------------------------------------
MODEL = ModelConfig(
    vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16,
)  # fmt: skip


def test_gpu_kv_budget_is_the_share_less_the_weights_and_the_reserve() -> None:
    total, weights = 24 * GIB, 2 * GIB
    budget = gpu_kv_budget(0.82, total, free=total - weights, in_use=weights)
    assert budget == int(total * 0.82) - weights - GPU_ACTIVATION_RESERVE
    assert gpu_kv_budget(0.5, total, total - weights, weights) < budget


def test_gpu_kv_budget_refuses_memory_other_processes_hold() -> None:
    total, weights, others = 24 * GIB, 2 * GIB, 10 * GIB
    with pytest.raises(ValueError, match="only 14.0 GiB are free for this process; lower it"):
        gpu_kv_budget(0.82, total, free=total - weights - others, in_use=weights)
    with pytest.raises(ValueError, match="leaves no room for a KV cache"):
        gpu_kv_budget(0.05, total, free=total - weights, in_use=weights)


def test_num_blocks_on_cuda_come_from_the_share(monkeypatch: pytest.MonkeyPatch) -> None:
    total, weights = 16 * GIB, GIB
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (total - weights, total))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: weights)
    cache = CacheConfig(gpu_memory_utilization=0.3, block_size=16)
    per_block = bytes_per_block(MODEL, cache.block_size, torch.bfloat16)
    n = num_blocks_for(MODEL, cache, torch.bfloat16, max_useful_tokens=1024, device="cuda:0")
    assert n == gpu_kv_budget(0.3, total, total - weights, weights) // per_block
    explicit = CacheConfig(gpu_memory_utilization=0.3, kv_cache_memory=100 * per_block)
    assert num_blocks_for(MODEL, explicit, torch.bfloat16, 1024, device="cuda:0") == 100  # the explicit budget wins


def test_gpu_memory_utilization_has_no_effect_on_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_cache, "available_memory_bytes", lambda: 64 * GIB)
    for useful in (1024, 10**7):
        default = num_blocks_for(MODEL, CacheConfig(), torch.bfloat16, useful)
        assert num_blocks_for(MODEL, CacheConfig(gpu_memory_utilization=0.82), torch.bfloat16, useful) == default
    per_block = bytes_per_block(MODEL, 16, torch.bfloat16)
    assert num_blocks_for(MODEL, CacheConfig(gpu_memory_utilization=0.82), torch.bfloat16, 10**7) * per_block <= (
        kv_cache.DEFAULT_MAX_KV_BYTES
    )


# -- several served names (the config) -----------------------------------------------------------
def test_served_model_names_are_a_tuple_of_non_empty_names() -> None:
    assert ServerConfig(served_model_names=["a", "b"]).served_model_names == ("a", "b")
    with pytest.raises(ConfigError, match="non-empty strings"):
        ServerConfig(served_model_names=("a", ""))


# -- SamplingParams ---------------------------------------------------------------------------------
def test_the_articles_sampling_params() -> None:
    params = SamplingParams(temperature=0.5, top_p=0.95, max_tokens=512, prompt_logprobs=None)
    assert (params.temperature, params.top_p, params.max_tokens, params.prompt_logprobs) == (0.5, 0.95, 512, None)
    assert SamplingParams(prompt_logprobs=2).prompt_logprobs == 2
    with pytest.raises(ValueError, match="prompt_logprobs must be non-negative"):
        SamplingParams(prompt_logprobs=-1)


@pytest.mark.parametrize(("n", "best_of"), [(1, None), (1, 1), (3, 3), (3, 1)])
def test_best_of_equal_to_n_is_accepted(n: int, best_of: int | None) -> None:
    assert SamplingParams(n=n, best_of=best_of).n == n


@pytest.mark.parametrize(("n", "best_of"), [(1, 2), (2, 5), (4, 2)])
def test_best_of_asking_for_extra_candidates_is_refused(n: int, best_of: int) -> None:
    with pytest.raises(ValueError, match=f"best_of {best_of} is not supported \\(vLLM's V1 engine dropped it"):
        SamplingParams(n=n, best_of=best_of)


def test_thinking_token_budget_is_thinking_budget() -> None:
    params = SamplingParams(thinking_token_budget=64)
    assert params.thinking_budget == 64
    assert params == SamplingParams(thinking_budget=64)
    assert SamplingParams(thinking_budget=64, thinking_token_budget=64).thinking_budget == 64
    assert params.with_updates(thinking_budget=8).thinking_budget == 8  # the alias does not linger
    with pytest.raises(ValueError, match="thinking_budget 8 and thinking_token_budget 64 disagree"):
        SamplingParams(thinking_budget=8, thinking_token_budget=64)
    with pytest.raises(ValueError, match="thinking_budget must be non-negative"):
        SamplingParams(thinking_token_budget=-1)


def test_vllm_no_op_fields_are_accepted() -> None:
    params = SamplingParams(detokenize=True, spaces_between_special_tokens=False, output_kind=None, max_tokens=8)
    assert params == SamplingParams(max_tokens=8)


def test_unsupported_vllm_fields_are_accepted_only_when_off() -> None:
    off = {name: None for name in VLLM_UNSUPPORTED} | {"use_beam_search": False}
    assert SamplingParams(**off) == SamplingParams()
    with pytest.raises(ValueError, match="truncate_prompt_tokens is not supported: prompts are never truncated"):
        SamplingParams(truncate_prompt_tokens=100)
    with pytest.raises(ValueError, match="use_beam_search is not supported"):
        SamplingParams(use_beam_search=True)


def test_an_unknown_field_fails_naming_the_known_ones() -> None:
    with pytest.raises(TypeError, match="unknown SamplingParams fields: temprature; known: ") as info:
        SamplingParams(temprature=0.5)
    known = str(info.value).split("known: ")[1].split(", ")
    assert {f.name for f in dataclasses.fields(SamplingParams)} <= set(known)
    assert "detokenize" in known
