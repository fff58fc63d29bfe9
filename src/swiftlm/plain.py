"""The plain generation path: one request at a time, dense KV, no batching, no cache reuse.

It is deliberately simple and stays in the code base as the reference every fast path is tested
against (``PlainLLM`` and ``LLM`` share the public interface).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import count
from typing import Any

import torch

from swiftlm.backends.attention import DenseAttention
from swiftlm.core.outputs import CompletionOutput, RequestOutput
from swiftlm.model.loader import load_model, load_tokenizer, resolve_model
from swiftlm.platform import resolve_dtype
from swiftlm.sampling import SamplingParams
from swiftlm.text.detokenizer import IncrementalDetokenizer
from swiftlm.text.tokenizer import Tokenizer

Prompt = str | dict[str, Any]


@dataclass(frozen=True, slots=True)
class StepResult:
    token_id: int
    logprobs: dict[int, float] | None


class PlainLLM:
    """``LLM``'s interface on the plain path (slow, obviously correct)."""

    def __init__(self, model: str, dtype: str = "auto", device: str = "cpu", max_model_len: int | None = None,
                 gguf_file: str | None = None) -> None:
        self.source = resolve_model(model, gguf_file)
        self.model_dir = self.source.directory
        self.device = device
        self.dtype = resolve_dtype(dtype, device)
        self.tokenizer = load_tokenizer(self.source)
        self.model = load_model(self.source, self.dtype, device)
        self.max_model_len = min(max_model_len or 8192, self.model.config.max_position_embeddings)
        self._ids = count()

    def default_sampling_params(self) -> SamplingParams:
        return SamplingParams.from_generation_config(self.tokenizer.generation_defaults)

    @torch.inference_mode()
    def stream(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> Iterator[StepResult]:
        """Yield sampled tokens one by one until a stop condition."""
        if not prompt_token_ids:
            raise ValueError("the prompt is empty")
        attention = DenseAttention(self.model.config.num_hidden_layers)
        rid = str(next(self._ids))
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids.update(self.tokenizer.eos_token_ids)
        max_tokens = self.max_model_len if params.max_tokens is None else params.max_tokens
        tokens = list(prompt_token_ids)
        new = tokens
        generated = 0
        while generated < max_tokens and len(tokens) < self.max_model_len:
            start = len(tokens) - len(new)
            input_ids = torch.tensor(new, device=self.device)
            positions = torch.arange(start, len(tokens), device=self.device)
            hidden = self.model(input_ids, positions, attention.bind([rid], [len(new)]))
            logits = self.model.compute_logits(hidden[-1:])[0]
            token, logprobs = _sample_one(logits, params, generator)
            generated += 1
            yield StepResult(token, logprobs)
            if token in stop_ids and generated > params.min_tokens:
                break
            tokens.append(token)
            new = [token]

    def generate(
        self, prompts: Prompt | Sequence[Prompt], sampling_params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        params = sampling_params or self.default_sampling_params()
        batch = [prompts] if isinstance(prompts, str | dict) else list(prompts)
        return [self._generate_one(p, params) for p in batch]

    def chat(
        self,
        messages: list[dict[str, Any]],
        sampling_params: SamplingParams | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> RequestOutput:
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tools=tools, **(chat_template_kwargs or {})
        )
        return self.generate({"prompt": text}, sampling_params)[0]

    def _generate_one(self, prompt: Prompt, params: SamplingParams) -> RequestOutput:
        text, ids = _prompt_ids(self.tokenizer, prompt)
        detok = IncrementalDetokenizer(self.tokenizer, skip_special_tokens=params.skip_special_tokens)
        out = CompletionOutput(index=0, text="", token_ids=[], logprobs=[] if params.logprobs is not None else None)
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.tokenizer.eos_token_ids))
        for step in self.stream(ids, params):
            out.token_ids.append(step.token_id)
            if out.logprobs is not None and step.logprobs is not None:
                out.logprobs.append(step.logprobs)
                out.cumulative_logprob = (out.cumulative_logprob or 0.0) + step.logprobs[step.token_id]
            if step.token_id in stop_ids and len(out.token_ids) > params.min_tokens:
                out.finish_reason, out.stop_reason = "stop", step.token_id
                if step.token_id in params.stop_token_ids:
                    out.text += detok.add(step.token_id)
                break
            out.text += detok.add(step.token_id)
        out.text += detok.flush()
        if out.finish_reason is None:
            out.finish_reason = "length"
        return RequestOutput(
            request_id=f"plain-{time.monotonic_ns()}", prompt=text, prompt_token_ids=ids, outputs=[out], finished=True
        )


def _prompt_ids(tokenizer: Tokenizer, prompt: Prompt) -> tuple[str | None, list[int]]:
    if isinstance(prompt, str):
        return prompt, tokenizer.encode(prompt)
    if "prompt_token_ids" in prompt:
        return prompt.get("prompt"), list(prompt["prompt_token_ids"])
    return prompt["prompt"], tokenizer.encode(prompt["prompt"])


def _sample_one(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[int, dict[int, float] | None]:
    """logits: [V] float32 -> (token, {token: logprob, top tokens...} or None)."""
    logprobs_all = torch.log_softmax(logits, dim=-1)
    if params.greedy:
        token = int(torch.argmax(logits))
    else:
        scaled = logits / params.temperature
        if params.top_k > 0:
            kth = torch.topk(scaled, min(params.top_k, scaled.numel())).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if params.top_p < 1.0:
            probs_sorted, order = torch.sort(torch.softmax(scaled, dim=-1), descending=True)
            # drop a token when the tokens before it already reach top_p
            drop_sorted = (torch.cumsum(probs_sorted, dim=-1) - probs_sorted) >= params.top_p
            scaled = scaled.masked_fill(torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted), float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        token = int(torch.multinomial(probs, 1, generator=generator))
    if params.logprobs is None:
        return token, None
    result = {token: float(logprobs_all[token])}
    if params.logprobs > 0:
        top = torch.topk(logprobs_all, params.logprobs)
        for tid, lp in zip(top.indices.tolist(), top.values.tolist(), strict=True):
            result.setdefault(tid, lp)
    return token, result
