"""/v1/completions echo + logprobs (the prompt scored), max_tokens 0, and vLLM's prompt_logprobs.

Numbers are checked against transformers' log-softmax on the float32 tiny checkpoint. The
lm-evaluation-harness test reads the response the way its ``local-completions`` loglikelihood
parser does: per choice, the continuation's ``token_logprobs`` summed, and whether each of its
tokens is the greedy one (its logprob equals the largest of ``top_logprobs``).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch

from swiftlm.text.tokenizer import Tokenizer
from tests.helpers.hf_reference import hf_model

transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def ref(tiny_tied_dir: Path):
    return hf_model(tiny_tied_dir, torch.float32)


@pytest.fixture(scope="module")
def tokenizer(tiny_tied_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_tied_dir)


@pytest.fixture(scope="module")
def server(start_server, tiny_tied_dir: Path):
    # a small step budget: prompts are prefilled in several chunks
    return start_server(tiny_tied_dir, block_size=16, max_num_batched_tokens=16)


@torch.inference_mode()
def reference(ref, ids: list[int]) -> torch.Tensor:
    """[L, V]: row i is transformers' log-softmax predicting token i + 1."""
    return torch.log_softmax(ref(torch.tensor([ids])).logits[0].float(), dim=-1)


def complete(server, **body) -> dict:
    r = httpx.post(f"{server.v1}/completions", json={"model": server.model, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def check_echoed_prompt(choice: dict, prompt: list[int], expected: torch.Tensor, tokenizer: Tokenizer) -> None:
    lp = choice["logprobs"]
    assert lp["tokens"][: len(prompt)] == [tokenizer.decode([t], skip_special_tokens=False) for t in prompt]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None and lp["text_offset"][0] == 0
    for i in range(1, len(prompt)):
        assert abs(lp["token_logprobs"][i] - expected[i - 1, prompt[i]].item()) <= TOLERANCE
        best = expected[i - 1].max().item()
        assert abs(max(lp["top_logprobs"][i].values()) - best) <= TOLERANCE
    offsets = lp["text_offset"][: len(prompt)]
    assert offsets == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(prompt))]


def test_echo_max_tokens_zero_scores_the_prompt(server, ref, tokenizer) -> None:
    text = "The quick brown fox jumps over the lazy dog, again and again, until the dog wakes up."
    prompt = tokenizer.encode(text)
    body = complete(server, prompt=text, echo=True, logprobs=1, max_tokens=0)
    (choice,) = body["choices"]
    assert choice["text"] == text and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == len(prompt)
    assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] == len(prompt)
    check_echoed_prompt(choice, prompt, reference(ref, prompt), tokenizer)
    server.assert_no_leaks()


def test_echo_with_a_cached_prefix_and_generated_tokens(server, ref, tokenizer) -> None:
    shared = "You are a careful assistant. Answer in one short sentence, and never use lists. " * 2
    first = shared + "What is the capital of France?"
    complete(server, prompt=first, max_tokens=1)  # caches the shared prefix's blocks
    again = complete(server, prompt=first, max_tokens=1)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    second = shared + "Name a river in Germany."
    prompt = tokenizer.encode(second)
    body = complete(server, prompt=second, echo=True, logprobs=2, max_tokens=3, temperature=0, ignore_eos=True)
    (choice,) = body["choices"]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(prompt) + 3 and choice["text"].startswith(second)
    check_echoed_prompt(choice, prompt, reference(ref, prompt), tokenizer)
    # the generated tokens follow, offset from the end of the echoed prompt
    assert lp["text_offset"][len(prompt)] == len(second)
    assert all(isinstance(v, float) for v in lp["token_logprobs"][len(prompt) :])
    server.assert_no_leaks()


def test_max_tokens_zero_needs_echo(server) -> None:
    r = httpx.post(f"{server.v1}/completions", json={"model": server.model, "prompt": "hi", "max_tokens": 0})
    assert r.status_code == 400 and "echo" in r.json()["error"]["message"]


def test_streamed_echo_logprobs_equal_the_whole_answer(server) -> None:
    body = {"model": server.model, "prompt": "Once upon a time, in a land far away,", "echo": True, "logprobs": 1,
            "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    whole = complete(server, **body)["choices"][0]
    tokens: list[str] = []
    values: list[float | None] = []
    text = ""
    with httpx.stream("POST", f"{server.v1}/completions", json={**body, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for c in json.loads(line[6:])["choices"]:
                text += c["text"]
                if c.get("logprobs"):
                    tokens += c["logprobs"]["tokens"]
                    values += c["logprobs"]["token_logprobs"]
    assert text == whole["text"]
    assert tokens == whole["logprobs"]["tokens"] and values == whole["logprobs"]["token_logprobs"]


def test_vllm_prompt_logprobs_field(server, ref, tokenizer) -> None:
    text = "Paris is the capital of"
    prompt = tokenizer.encode(text)
    expected = reference(ref, prompt)
    body = complete(server, prompt=text, prompt_logprobs=2, max_tokens=1, temperature=0)
    (choice,) = body["choices"]
    assert "logprobs" not in choice  # only the prompt was asked for
    scored = choice["prompt_logprobs"]
    assert len(scored) == len(prompt) and scored[0] is None
    for i in range(1, len(prompt)):
        entry = {int(k): v for k, v in scored[i].items()}
        assert prompt[i] in entry and len(entry) <= 3
        top = torch.topk(expected[i - 1], 2).indices.tolist()
        assert [entry[t]["rank"] for t in top] == [1, 2]
        for tid, item in entry.items():
            assert abs(item["logprob"] - expected[i - 1, tid].item()) <= TOLERANCE
            assert item["decoded_token"] == tokenizer.decode([tid], skip_special_tokens=False)
    r = httpx.post(f"{server.v1}/completions", json={"model": server.model, "prompt": text, "prompt_logprobs": 1,
                                                      "stream": True})
    assert r.status_code == 400 and "stream" in r.json()["error"]["message"]


def test_chat_prompt_logprobs_top_level(server, ref) -> None:
    messages = [{"role": "user", "content": "Say hello."}]
    r = httpx.post(f"{server.v1}/chat/completions", timeout=60, json={
        "model": server.model, "messages": messages, "prompt_logprobs": 1, "max_tokens": 2,
        "chat_template_kwargs": {"enable_thinking": False},
    })
    assert r.status_code == 200, r.text
    body = r.json()
    prompt_ids = httpx.post(f"{server.base_url}/tokenize", json={
        "model": server.model, "messages": messages, "chat_template_kwargs": {"enable_thinking": False},
    }).json()["tokens"]
    scored = body["prompt_logprobs"]
    assert len(scored) == len(prompt_ids) == body["usage"]["prompt_tokens"] and scored[0] is None
    expected = reference(ref, prompt_ids)
    for i in range(1, len(prompt_ids)):
        assert abs(scored[i][str(prompt_ids[i])]["logprob"] - expected[i - 1, prompt_ids[i]].item()) <= TOLERANCE


# ---------------------------------------------------------------- lm-evaluation-harness


def harness_loglikelihood(choice: dict, ctxlen: int, generated: int) -> tuple[float, bool]:
    """How ``local-completions`` scores a continuation: the logprobs after the context (dropping the
    generated tokens at the end), and whether each equals the best of its top_logprobs."""
    lp = choice["logprobs"]
    end = len(lp["token_logprobs"]) - generated
    values = lp["token_logprobs"][ctxlen:end]
    tops = lp["top_logprobs"][ctxlen:end]
    return sum(values), all(v == max(top.values()) for v, top in zip(values, tops, strict=True))


def expected_loglikelihood(ref, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    ids = context + continuation
    lp = reference(ref, ids)
    rows = range(len(context) - 1, len(ids) - 1)
    total = sum(lp[r, ids[r + 1]].item() for r in rows)
    return total, all(int(lp[r].argmax()) == ids[r + 1] for r in rows)


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_lm_eval_harness_text_prompts(server, ref, tokenizer, max_tokens: int) -> None:
    context = "Question: which animal barks? Answer:"
    continuations = [" the dog", " a cat that sleeps", " fish"]
    ctx_ids = tokenizer.encode(context)
    for cont in continuations:  # the harness splits context and continuation this way
        assert tokenizer.encode(context + cont) == ctx_ids + tokenizer.encode(cont)
    body = complete(server, prompt=[context + c for c in continuations], temperature=0, max_tokens=max_tokens,
                    logprobs=1, seed=1234, echo=True)
    choices = sorted(body["choices"], key=lambda c: c["index"])
    assert len(choices) == len(continuations)
    for choice, cont in zip(choices, continuations, strict=True):
        got, greedy = harness_loglikelihood(choice, len(ctx_ids), max_tokens)
        want, want_greedy = expected_loglikelihood(ref, ctx_ids, tokenizer.encode(cont))
        assert abs(got - want) <= TOLERANCE * len(cont) and greedy == want_greedy
    server.assert_no_leaks()


@torch.inference_mode()
def test_lm_eval_harness_token_prompts_with_a_greedy_continuation(server, ref, tokenizer) -> None:
    context = tokenizer.encode("Numbers: one, two, three,")
    out = ref.generate(torch.tensor([context]), max_new_tokens=3, do_sample=False)
    greedy = out[0, len(context) :].tolist()
    other = [t + 1 for t in greedy]
    body = complete(server, prompt=[context + greedy, context + other], temperature=0, max_tokens=1, logprobs=1,
                    echo=True)
    choices = sorted(body["choices"], key=lambda c: c["index"])
    results = [harness_loglikelihood(c, len(context), 1) for c in choices]
    for (got, is_greedy), cont in zip(results, (greedy, other), strict=True):
        want, want_greedy = expected_loglikelihood(ref, context, cont)
        assert abs(got - want) <= TOLERANCE * len(cont) and is_greedy == want_greedy
    assert [g for _, g in results] == [True, False]
