"""The CPU backend's one-pass greedy pick and token draw against the sampler: the same tokens, and
the same failure for a row of non-finite logits; and which rows may take them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swiftlm import LLM, SamplingParams
from swiftlm.backends.cpu.backend import CpuBackend
from swiftlm.runner.sampler import plain_greedy
from swiftlm.runner.sampling_row import SamplingRow

PROMPTS = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [9, 3, 11, 2, 8]}]


def _generate(llm: LLM, params: SamplingParams) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params)]


def _spied(model_dir: Path, monkeypatch: pytest.MonkeyPatch, kernel: str, method: str) -> tuple[LLM, CpuBackend, list]:
    """An LLM on a CPU backend whose ``method`` records the logits' shape of each call."""
    backend = CpuBackend()
    if getattr(backend.kernels, kernel) is None:
        pytest.fail(f"{kernel} is plain C++ and must build wherever torch extensions do")
    llm = LLM(str(model_dir), dtype="float32", backend=backend)
    calls: list = []
    inner = getattr(backend, method)
    monkeypatch.setattr(backend, method, lambda logits, *a: calls.append(logits.shape) or inner(logits, *a))
    return llm, backend, calls


def test_greedy_pick_gives_the_samplers_tokens(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    llm, backend, calls = _spied(tiny_model_dir, monkeypatch, "fused_ops", "greedy_pick")
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    fast = _generate(llm, params)
    assert calls, "plain greedy rows took the one-pass pick"
    monkeypatch.setattr(backend, "greedy_pick", lambda logits: None)
    assert fast == _generate(llm, params)


@pytest.mark.parametrize("min_p", [0.0, 0.1])
def test_token_draw_gives_the_torch_draws_tokens(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                 min_p: float) -> None:
    """Sampled (unseeded) and greedy rows in one step: from the same torch RNG state, the one-pass
    draw and the torch draw take the same uniforms, and so the same tokens."""
    llm, backend, calls = _spied(tiny_model_dir, monkeypatch, "token_draw", "draw_tokens")
    sampled = SamplingParams(temperature=0.9, min_p=min_p, max_tokens=16, ignore_eos=True)
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    prompts = PROMPTS * 3

    def run() -> list[list[int]]:
        torch.manual_seed(123)
        outs = llm.generate(prompts, [sampled, greedy, sampled, sampled, greedy, sampled])
        return [list(o.outputs[0].token_ids) for o in outs]

    fast = run()
    assert calls, "sampled rows took the one-pass draw"
    monkeypatch.setattr(CpuBackend, "draws_tokens", property(lambda self: False))
    calls.clear()
    assert fast == run() and not calls
    assert fast[0] != fast[2] or fast[2] != fast[3], "the sampled rows drew"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_logits_fail_the_row_through_the_pick(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, bad: float
) -> None:
    backend = CpuBackend()
    llm = LLM(str(tiny_model_dir), dtype="float32", backend=backend)
    calls = []
    pick = backend.greedy_pick
    monkeypatch.setattr(backend, "greedy_pick", lambda logits: calls.append(logits.shape) or pick(logits))
    poisoned = []

    def poison(stage: str, logits: torch.Tensor | None) -> None:
        if stage == "logits" and logits is not None and logits.shape[0] == 2 and not poisoned:
            logits[1, 3] = bad  # the second request's row, once
            poisoned.append(True)

    llm.engine.runner.fault_hook = poison
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert poisoned and calls
    assert llm.engine.num_failed_rows == 1
    assert len(outs[0].outputs[0].token_ids) == 4  # the other request goes on
    assert outs[1].outputs[0].finish_reason == "error"


def _row(**kw) -> SamplingRow:
    fields = {k: kw.pop(k) for k in ("banned_token_ids", "forced_token_id") if k in kw}
    return SamplingRow(SamplingParams(temperature=0.0, **kw), [1, 2], [3], None, **fields)


def test_which_rows_are_plain_greedy() -> None:
    assert plain_greedy([_row(), _row(max_tokens=3)])
    assert not plain_greedy([_row(), _row(logprobs=2)])
    assert not plain_greedy([_row(logit_bias={4: 1.0})])
    assert not plain_greedy([_row(repetition_penalty=1.2)])
    assert not plain_greedy([_row(presence_penalty=0.5)])
    assert not plain_greedy([_row(banned_token_ids=[0])])
    assert not plain_greedy([_row(forced_token_id=4)])
    sampled = SamplingRow(SamplingParams(temperature=0.7), [1], [], None)
    assert not plain_greedy([_row(), sampled])
