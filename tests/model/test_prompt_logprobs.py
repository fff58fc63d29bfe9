"""SamplingParams.prompt_logprobs against transformers' log-softmax (float32, tiny checkpoint).

The prompt's logprobs come from the forward pass that computes the prompt, across chunked
prefill chunks; a prompt sharing a cached prefix recomputes it (its hit tokens have no logits).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swiftlm import LLM, SamplingParams
from tests.helpers.hf_reference import hf_model

transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4


def random_prompt(length: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 151643, (length,), generator=g).tolist()


@torch.inference_mode()
def reference(ref, prompt: list[int]) -> torch.Tensor:
    """[L, V]: row i is transformers' log-softmax predicting prompt token i + 1."""
    return torch.log_softmax(ref(torch.tensor([prompt])).logits[0].float(), dim=-1)


def worst_error(prompt: list[int], got: list[dict[int, float] | None], expected: torch.Tensor, k: int) -> float:
    """Checks the shape of ``got`` (None first, then the prompt token and the top k) and returns
    the largest logprob difference from ``expected``."""
    assert len(got) == len(prompt) and got[0] is None
    worst = 0.0
    for i in range(1, len(prompt)):
        entry = got[i]
        assert entry is not None and next(iter(entry)) == prompt[i]
        top = set(torch.topk(expected[i - 1], k).indices.tolist()) if k else set()
        assert top <= set(entry) and len(entry) <= k + 1
        worst = max(worst, *(abs(v - expected[i - 1, t].item()) for t, v in entry.items()))
    return worst


@pytest.fixture(scope="module")
def ref(tiny_tied_dir: Path):
    return hf_model(tiny_tied_dir, torch.float32)


@pytest.mark.parametrize("chunk", [512, 16])
def test_prompt_logprobs_match_transformers(tiny_tied_dir: Path, ref, chunk: int) -> None:
    llm = LLM(str(tiny_tied_dir), dtype="float32", block_size=16, max_num_batched_tokens=chunk)
    prompts = [random_prompt(n, seed=n) for n in (1, 2, 37, 70)]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], SamplingParams(prompt_logprobs=2, max_tokens=1, temperature=0)
    )
    for prompt, out in zip(prompts, outs, strict=True):
        assert len(out.outputs[0].token_ids) == 1
        if len(prompt) == 1:
            assert out.prompt_logprobs == [None]
            continue
        assert worst_error(prompt, out.prompt_logprobs, reference(ref, prompt), 2) <= TOLERANCE


def test_prompt_sharing_a_cached_prefix_is_recomputed(tiny_tied_dir: Path, ref) -> None:
    llm = LLM(str(tiny_tied_dir), dtype="float32", block_size=16, max_num_batched_tokens=24)
    shared = random_prompt(48, seed=5)
    first = llm.generate({"prompt_token_ids": shared + random_prompt(5, seed=6)}, SamplingParams(max_tokens=1))[0]
    assert first.num_cached_tokens == 0
    prompt = shared + random_prompt(20, seed=7)
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(prompt_logprobs=1, max_tokens=1))[0]
    assert out.num_cached_tokens == 0  # the hit blocks were recomputed to be scored
    assert worst_error(prompt, out.prompt_logprobs, reference(ref, prompt), 1) <= TOLERANCE
    # the same prefix is still a hit for a request that does not ask for prompt logprobs
    plain = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=1))[0]
    # (4 whole blocks; the 3 rows after them are fewer than a partial match's 4)
    assert plain.num_cached_tokens == 64 and plain.prompt_logprobs is None


def test_max_tokens_zero_scores_the_prompt_and_generates_nothing(tiny_tied_dir: Path, ref) -> None:
    llm = LLM(str(tiny_tied_dir), dtype="float32", block_size=16, max_num_batched_tokens=16)
    prompt = random_prompt(40, seed=8)
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(prompt_logprobs=0, max_tokens=0))[0]
    seq = out.outputs[0]
    assert seq.token_ids == [] and seq.text == "" and seq.finish_reason == "length"
    assert worst_error(prompt, out.prompt_logprobs, reference(ref, prompt), 0) <= TOLERANCE
    assert llm.engine.kv.pool.num_free_blocks == llm.engine.kv.pool.num_usable_blocks
    assert not llm.engine.has_unfinished()


def test_prompt_logprobs_with_n_and_without(tiny_tied_dir: Path, ref) -> None:
    llm = LLM(str(tiny_tied_dir), dtype="float32", block_size=16)
    prompt = random_prompt(30, seed=9)
    params = SamplingParams(prompt_logprobs=1, max_tokens=3, n=2, temperature=1.0, seed=3, ignore_eos=True)
    with_n, without = llm.generate(
        [{"prompt_token_ids": prompt}] * 2, [params, SamplingParams(max_tokens=3, ignore_eos=True)]
    )
    assert [len(s.token_ids) for s in with_n.outputs] == [3, 3]
    assert worst_error(prompt, with_n.prompt_logprobs, reference(ref, prompt), 1) <= TOLERANCE
    assert without.prompt_logprobs is None


def test_preempted_request_keeps_its_prompt_logprobs(tiny_tied_dir: Path, ref) -> None:
    # 8 blocks of 16 tokens: two long requests cannot both grow, so one is preempted and recomputes
    llm = LLM(str(tiny_tied_dir), dtype="float32", block_size=16, num_blocks=9, max_num_batched_tokens=32)
    prompts = [random_prompt(40, seed=10), random_prompt(40, seed=11)]
    params = SamplingParams(prompt_logprobs=1, max_tokens=60, ignore_eos=True, temperature=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert llm.engine.scheduler.num_preemptions > 0
    for prompt, out in zip(prompts, outs, strict=True):
        assert worst_error(prompt, out.prompt_logprobs, reference(ref, prompt), 1) <= TOLERANCE
