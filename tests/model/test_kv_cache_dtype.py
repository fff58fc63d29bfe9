"""The small KV cache (--kv-cache-dtype int8 | fp8 | fp8_e5m2): every engine path against the torch
oracle path with the same cache (greedy tokens identical in float32), the decode layers op bit for bit
the Python loop (pools and scales too), prefix hits, sessions and preemption unchanged, and the
numerical cost against the model's own dtype, measured and bounded."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from swiftlm import LLM, SamplingParams
from swiftlm.backends.cpu.backend import CpuBackend
from swiftlm.backends.cpu.ops import CpuKernels
from tests.model.test_engine_equivalence import assert_no_leaks, random_prompts

FORMATS = ["int8", "fp8", "fp8_e5m2"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
LENGTHS = [1, 3, 16, 17, 33, 100, 257, 420]


def run(llm: LLM, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return random_prompts(LENGTHS, seed=17)


@pytest.fixture(scope="module")
def oracle_outputs(tiny_tied_dir: Path, prompts: list[list[int]]) -> dict[str, list[list[int]]]:
    """The torch reference path with each cache format: one request at a time, no prefix cache."""
    out = {}
    for fmt in FORMATS:
        llm = LLM(str(tiny_tied_dir), dtype="float32", kv_cache_dtype=fmt, cpu_kernels=False, cpu_prepack=False,
                  enable_prefix_caching=False)
        out[fmt] = [run(llm, [p])[0] for p in prompts]
    return out


BATCHED, CHUNKED, PREEMPTING = {}, {"max_num_batched_tokens": 7}, {"num_blocks": 15, "max_num_batched_tokens": 64}


@pytest.mark.parametrize(("fmt", "engine_kwargs"), [
    ("int8", BATCHED), ("int8", CHUNKED), ("int8", PREEMPTING), ("fp8", BATCHED), ("fp8", PREEMPTING),
    ("fp8_e5m2", CHUNKED),
], ids=["int8-batched", "int8-chunked-7", "int8-preempting", "fp8-batched", "fp8-preempting", "e5m2-chunked-7"])
def test_kernel_paths_equal_the_oracle(tiny_tied_dir: Path, prompts, oracle_outputs, fmt: str, engine_kwargs) -> None:
    llm = LLM(str(tiny_tied_dir), dtype="float32", kv_cache_dtype=fmt, **engine_kwargs)
    assert llm.engine.kv_cache.fmt is not None
    assert llm.engine.backend.decode_kernel is not None or "decode attention" in llm.engine.backend.describe()
    assert run(llm, prompts) == oracle_outputs[fmt]
    if "num_blocks" in engine_kwargs:
        assert llm.engine.scheduler.num_preemptions > 0
    assert_no_leaks(llm)


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_prefix_hits_and_session_turns_equal_cold(tiny_tied_dir: Path, fmt: str) -> None:
    llm = LLM(str(tiny_tied_dir), dtype="float32", kv_cache_dtype=fmt)
    cold = LLM(str(tiny_tied_dir), dtype="float32", kv_cache_dtype=fmt, enable_prefix_caching=False)
    system = random_prompts([200], seed=3)[0]
    cases = [system + t for t in random_prompts([1, 9, 40], seed=4)]
    got = llm.generate([{"prompt_token_ids": cases[0]}], GREEDY) + llm.generate(
        [{"prompt_token_ids": p} for p in cases[1:]], GREEDY)
    # all 200 shared tokens: 6 whole blocks of 32, and 8 rows of a copy of the first prompt's 7th block
    assert llm.engine.kv.block_size == 32 and [o.num_cached_tokens for o in got] == [0, 200, 200]
    assert [o.outputs[0].token_ids for o in got] == run(cold, cases)
    # a session's second turn computes only its new tokens and answers as a fresh prompt does
    messages = [{"role": "system", "content": "Be brief. " * 30}, {"role": "user", "content": "Hi"}]
    first = llm.chat(messages, GREEDY, {"enable_thinking": False}, session_id="s")
    messages += [{"role": "assistant", "content": first.outputs[0].text}, {"role": "user", "content": "And then?"}]
    second = llm.chat(messages, GREEDY, {"enable_thinking": False}, session_id="s")
    assert second.num_cached_tokens == len(first.prompt_token_ids) + len(first.outputs[0].token_ids) - 1
    assert second.outputs[0].token_ids == run(cold, [second.prompt_token_ids])[0]
    assert llm.close_session("s")
    assert_no_leaks(llm)


@pytest.mark.parametrize("fmt", ["auto", "int8"])
def test_a_hit_inside_a_block_takes_a_copy_of_it(tiny_tied_dir: Path, fmt: str) -> None:
    """Prompts sharing 250 tokens with a finished one reuse all 250: the whole blocks, and a copy of
    the block the shared part ends inside (values and, 8-bit, scales), its later rows overwritten by
    their own; they answer as cold prompts do, and the copy's source is released."""
    llm = LLM(str(tiny_tied_dir), dtype="float32", kv_cache_dtype=fmt)
    cold = LLM(str(tiny_tied_dir), dtype="float32", kv_cache_dtype=fmt, enable_prefix_caching=False)
    bs = llm.engine.kv.block_size
    shared = random_prompts([250], seed=5)[0]
    cases = [shared + t for t in random_prompts([1, 3, 30], seed=6)]
    got = llm.generate([{"prompt_token_ids": cases[0]}], GREEDY) + llm.generate(
        [{"prompt_token_ids": p} for p in cases[1:]], GREEDY)
    assert 250 % bs and [o.num_cached_tokens for o in got] == [0, 250, 250]
    assert [o.outputs[0].token_ids for o in got] == run(cold, cases)
    assert llm.engine.kv.pending_copies == []
    # a next turn that extends a finished prompt reuses all of it, the rows of its last, partly
    # computed block copied too
    first = llm.generate([{"prompt_token_ids": shared}], SamplingParams(temperature=0.0, max_tokens=1))[0]
    turn = shared + first.outputs[0].token_ids + random_prompts([5], seed=7)[0]
    again = llm.generate([{"prompt_token_ids": turn}], GREEDY)[0]
    assert again.num_cached_tokens == 250 and again.outputs[0].token_ids == run(cold, [turn])[0]
    assert_no_leaks(llm)


@pytest.fixture(scope="module")
def kernels() -> CpuKernels:
    loaded = CpuKernels.load()
    if loaded.decode_layers is None:
        pytest.skip(f"the decode layers op is not available here: {loaded.missing}")
    return loaded


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_layers_op_equals_python_loop_bit_for_bit(kernels: CpuKernels, tiny_untied_dir: Path, fmt: str) -> None:
    """bf16: the op quantises K/V in C++ as the reference does in torch: the same pools, scales,
    tokens and logprobs."""
    calls: list[int] = []
    op = kernels.decode_layers

    def counted(residual, h, *args):
        calls.append(h.shape[0])
        return op(residual, h, *args)

    kwargs = {"dtype": "bfloat16", "kv_cache_dtype": fmt, "max_num_batched_tokens": 4096}
    fast = LLM(str(tiny_untied_dir), backend=CpuBackend(kernels=dataclasses.replace(kernels, decode_layers=counted)),
               **kwargs)
    slow = LLM(str(tiny_untied_dir), backend=CpuBackend(kernels=dataclasses.replace(kernels, decode_layers=None)),
               **kwargs)
    batch = random_prompts([3, 30, 70, 129], seed=5)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2)
    a, b = (llm.generate([{"prompt_token_ids": p} for p in batch], params) for llm in (fast, slow))
    assert [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in a] == \
        [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in b]
    assert calls, "decode steps went through the op"
    for cache_a, cache_b in ((fast.engine.kv_cache, slow.engine.kv_cache),):
        for x, y in zip((*cache_a.pools()[0], *cache_a.pools()[1], *cache_a.scale_pools()[0], *cache_a.scale_pools()[1]),
                        (*cache_b.pools()[0], *cache_b.pools()[1], *cache_b.scale_pools()[0], *cache_b.scale_pools()[1]),
                        strict=True):
            assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))


def teacher_forced(llm: LLM, sequences: list[list[int]]) -> list[list[dict[int, float]]]:
    params = SamplingParams(prompt_logprobs=1, max_tokens=1, temperature=0.0)
    return [o.prompt_logprobs[1:] for o in llm.generate([{"prompt_token_ids": s} for s in sequences], params)]


def cost(sequences: list[list[int]], want: list, got: list) -> tuple[float, float]:
    """(top-1 agreement, max |delta logprob| of the sequences' own tokens) of two teacher-forced runs."""
    agree = total = 0
    worst = 0.0
    for seq, rows_w, rows_g in zip(sequences, want, got, strict=True):
        for pos, (w, g) in enumerate(zip(rows_w, rows_g, strict=True)):
            token = seq[pos + 1]
            worst = max(worst, abs(w[token] - g[token]))
            agree += max(w, key=w.get) == max(g, key=g.get)
            total += 1
    return agree / total, worst


# float32: the cache's own error; the bf16 model's is mostly bf16's (its row is printed beside)
BOUNDS = {"int8": (0.97, 0.03), "fp8": (0.9, 0.15), "fp8_e5m2": (0.85, 0.4)}


@pytest.mark.parametrize("model", ["tied", "untied"])
def test_numerical_cost_against_the_models_dtype(tiny_tied_dir: Path, tiny_untied_dir: Path, model: str) -> None:
    """The same sequences scored (teacher forced, prompt logprobs) with the model's dtype in the
    cache and with each 8-bit format: top-1 agreement and the largest change of a chosen token's
    logprob, in float32 (bounded) and in bf16 (printed, with bf16's own noise against float32 beside:
    on random tiny checkpoints that noise dominates)."""
    path = str(tiny_tied_dir if model == "tied" else tiny_untied_dir)
    prompts = random_prompts([20, 90], seed=8)
    for dtype in ("float32", "bfloat16"):
        base = LLM(path, dtype=dtype, enable_prefix_caching=False)
        if dtype == "float32":
            gen = base.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0.0, max_tokens=32))
            sequences = [p + o.outputs[0].token_ids for p, o in zip(prompts, gen, strict=True)]
            f32 = teacher_forced(base, sequences)
        want = teacher_forced(base, sequences)
        if dtype == "bfloat16":
            print(f"{model} bf16 cache vs float32 model: agreement %.3f, max |dlogprob| %.4f" % cost(sequences, f32, want))
        for fmt in FORMATS:
            llm = LLM(path, dtype=dtype, kv_cache_dtype=fmt, enable_prefix_caching=False)
            agree, worst = cost(sequences, want, teacher_forced(llm, sequences))
            print(f"{model} {dtype} {fmt} cache vs {dtype} cache: top-1 agreement {agree:.3f}, max |dlogprob| {worst:.4f}")
            if dtype == "float32":
                assert agree >= BOUNDS[fmt][0] and worst <= BOUNDS[fmt][1], (fmt, agree, worst)


def test_block_size_left_open_is_the_backends(tiny_tied_dir: Path) -> None:
    """No block_size: the CPU kernels' backend takes 32 tokens for the 8-bit caches (a block's K rows
    then span as many bytes as bf16's 16) and 16 otherwise; the plain torch backend 16; a given size
    wins. The engine, its pools and its block manager agree."""
    cases = [({"kv_cache_dtype": "int8"}, 32), ({"kv_cache_dtype": "fp8"}, 32), ({}, 16),
             ({"kv_cache_dtype": "int8", "block_size": 16}, 16), ({"kv_cache_dtype": "int8", "cpu_kernels": False}, 16)]
    for kwargs, want in cases:
        engine = LLM(str(tiny_tied_dir), dtype="float32", num_blocks=8, **kwargs).engine
        assert engine.cache_config.block_size == engine.kv_cache.block_size == engine.kv.block_size == want, kwargs
        assert engine.config.cache.block_size == kwargs.get("block_size"), kwargs
