"""The model and the plain path against Hugging Face transformers' Qwen3 on the same checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swiftlm import SamplingParams
from swiftlm.backends.attention import DenseAttention
from swiftlm.model.loader import load_model
from swiftlm.plain import PlainLLM
from tests.helpers.hf_reference import hf_greedy, hf_model

transformers = pytest.importorskip("transformers")

PROMPT_LENGTHS = (1, 17, 128, 300)


def random_prompt(length: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 151643, (length,), generator=g).tolist()


@pytest.mark.parametrize("length", PROMPT_LENGTHS)
@torch.inference_mode()
def test_logits_match_transformers_float32(tiny_model_dir: Path, length: int) -> None:
    assert _max_logit_diff(tiny_model_dir, length) <= 1e-4


def _max_logit_diff(model_dir: Path, length: int) -> float:
    """Max |logit difference| against transformers' own class for the checkpoint, one prompt."""
    ours = load_model(model_dir, "float32")
    ref = hf_model(model_dir, torch.float32)
    assert type(ref).__name__ == ours.config.architecture
    prompt = random_prompt(length, seed=length)
    expected = ref(torch.tensor([prompt])).logits[0].float()  # [L, V]
    attention = DenseAttention(ours.config.num_hidden_layers)
    hidden = ours(torch.tensor(prompt), torch.arange(length), attention.bind(["r"], [length]))
    diff = (ours.compute_logits(hidden) - expected).abs().max().item()
    print(f"{ours.config.architecture} {model_dir.name} prompt {length}: max |logit diff| = {diff:.2e}")
    return diff


# greedy tokens compared: the CI form's first 32 of each prompt's, all 64 with -m slow
@pytest.mark.parametrize("steps", [32, pytest.param(64, marks=pytest.mark.slow)])
@torch.inference_mode()
def test_greedy_and_logprobs_match_transformers_float32(tiny_model_dir: Path, steps: int) -> None:
    llm = PlainLLM(str(tiny_model_dir), dtype="float32")
    ref = hf_model(tiny_model_dir, torch.float32)
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True, logprobs=3)
    worst = 0.0
    for length in PROMPT_LENGTHS:
        prompt = random_prompt(length, seed=100 + length)
        expected_tokens, expected_logprobs = hf_greedy(ref, prompt, steps)
        out = llm.generate({"prompt_token_ids": prompt}, params)[0].outputs[0]
        assert out.token_ids == expected_tokens, f"prompt {length}"
        for step, (tok, lp) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
            for tid, value in lp.items():
                worst = max(worst, abs(value - expected_logprobs[step][tid].item()))
            assert next(iter(lp)) == tok
    print(f"{tiny_model_dir.name}: {steps}-token greedy identical; max |logprob diff| = {worst:.2e}")
    assert worst <= 1e-4


@torch.inference_mode()
def test_bfloat16_greedy_agrees_with_transformers(tiny_model_dir: Path) -> None:
    llm = PlainLLM(str(tiny_model_dir), dtype="bfloat16")
    ref = hf_model(tiny_model_dir, torch.bfloat16)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    same = total = 0
    for length in PROMPT_LENGTHS:
        prompt = random_prompt(length, seed=200 + length)
        expected, _ = hf_greedy(ref, prompt, 32)
        got = llm.generate({"prompt_token_ids": prompt}, params)[0].outputs[0].token_ids
        # positions up to the first divergence count as agreeing; after it the contexts differ
        agree = next((i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b), len(got))
        same += agree
        total += len(got)
    print(f"{tiny_model_dir.name} bf16: {same}/{total} = {same / total:.1%} greedy positions identical")
    assert same / total >= 0.9


@pytest.mark.parametrize("length", (1, 128, 300))
@torch.inference_mode()
def test_llama_and_qwen2_logits_match_transformers_float32(tiny_arch_dir: Path, length: int) -> None:
    """Llama (Llama 3 rotary scaling, tied head, 3 heads on 1 KV head) and Qwen2 (q/k/v biases,
    5 heads of 24) against transformers' own classes for them."""
    assert _max_logit_diff(tiny_arch_dir, length) <= 1e-4


@pytest.mark.parametrize("steps", [24, pytest.param(48, marks=pytest.mark.slow)])
@torch.inference_mode()
def test_llama_and_qwen2_greedy_match_transformers_float32(tiny_arch_dir: Path, steps: int) -> None:
    llm = PlainLLM(str(tiny_arch_dir), dtype="float32")
    ref = hf_model(tiny_arch_dir, torch.float32)
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)
    for length in (17, 300):
        prompt = random_prompt(length, seed=300 + length)
        expected, _ = hf_greedy(ref, prompt, steps)
        assert llm.generate({"prompt_token_ids": prompt}, params)[0].outputs[0].token_ids == expected
