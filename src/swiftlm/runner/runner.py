"""ModelRunner: runs one scheduled step through the model and samples. Makes no policy decisions.

Device-agnostic: the backend it is given runs the forward pass and owns attention over the KV cache.

Prompt logprobs come from the same forward pass as the prompt: the rows ``PromptRows`` names get
logits too (float32 log-softmax), a slice of rows at a time, so a long chunk holds at most
``PROMPT_LOGITS_ROWS`` x vocab floats at once. Steps without such rows run exactly as before.

A logit row that is not finite (NaN or inf: a broken kernel, an overflow) is never sampled: its
request is reported in ``StepResult.failed`` and the other rows of the step go on (one sum over the
step's logits finds out, ~0.3 ms for 16 rows of Qwen3's vocabulary).

``fault_hook`` is the tests' way in (fault injection): when set, it is called with ("forward",
None) before the forward (it may raise) and with ("logits", logits) after the lm_head (it may
change them in place)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from swiftlm.backends.base import Backend
from swiftlm.backends.kv_cache import KVCache
from swiftlm.core.schedule import SchedulerOutput
from swiftlm.model.decoder import DecoderForCausalLM
from swiftlm.runner.block_tables import DecodeTables
from swiftlm.runner.inputs import PromptRows, StepInputs, build_step_inputs, host_int64
from swiftlm.runner.sampler import (
    Sampler,
    SamplerOutput,
    SamplingRow,
    draw_columns,
    drawn_on_device,
    plain_greedy,
    sample_on_device,
)
from swiftlm.runner.sampling_row import PlainRows

PROMPT_LOGITS_ROWS = 128  # prompt rows scored per lm_head call (bounds the [rows, vocab] buffer)


@dataclass(slots=True)  # not frozen: one per sampled row every step (a frozen init costs ~4x)
class SampledToken:
    token_id: int
    logprobs: dict[int, float] | None  # sampled token first, then the top tokens


@dataclass(slots=True)  # not frozen: ``ModelRunner._results`` fills it in
class StepResult:
    sampled: list[SampledToken | None]  # per scheduled request: its token, or None (mid-prefill chunk)
    # scheduled index -> logprobs of the prompt tokens this step scored, in order: the target token
    # first, then the top tokens (only requests with prompt_logprobs appear)
    prompt_logprobs: dict[int, list[dict[int, float]]]
    failed: dict[int, str] = field(default_factory=dict)  # scheduled index -> why its row was not sampled
    # scheduled index -> the tokens sampled at its draft rows, in order (requests with draft tokens:
    # ``sampled`` holds the token at its last real token's row, these the k tokens after)
    draft_samples: dict[int, list[SampledToken]] = field(default_factory=dict)
    # [S] the token of every sampled row, in row order (0 for a failed row): the next overlapped
    # step reads its pending input tokens here
    row_tokens: list[int] = field(default_factory=list)
    # every scheduled request sampled one token, in order, none failed, no logprobs or drafts: its
    # token is ``row_tokens[i]`` and ``sampled`` is left empty (None)
    plain: bool = False


@dataclass(frozen=True, slots=True)
class PreparedStep:
    """A step's inputs, built on the host; ``ModelRunner.launch`` starts it (on the device's thread
    when steps overlap) and ``ModelRunner.collect`` reads its results."""

    inputs: StepInputs
    rows: Sequence[SamplingRow]
    num_scheduled: int
    plain_greedy: bool | None = None  # every row is plain greedy (``sampler.plain_greedy``); None: look
    drawn: bool = False  # every row is plain greedy or drawn at its temperature alone, ``rows`` a ``PlainRows``


@dataclass(slots=True)
class LaunchedRun:
    """A step the device has been given. Steps whose rows the device can choose alone (plain greedy,
    temperature only: ``sampler.drawn_on_device``) leave their tokens on the device
    (``tokens``, ``finite``; on CUDA copied to pinned host memory behind ``ready``, so that reading
    them waits for this step's kernels and not for a later step's); other steps sampled on the host
    already (``out``, ``failed``)."""

    step: PreparedStep
    prompt: dict[int, list[dict[int, float]]]
    tokens: torch.Tensor | None = None  # [S] int64 on the device: each sampled row's token
    finite: torch.Tensor | None = None  # [S] bool on the device (greedy pick): rows whose logits were finite
    host: torch.Tensor | None = None  # [2, S] int64 pinned copy of tokens and finite (CUDA)
    ready: Any = None  # ``Backend.step_launched()``: waits for the step's work (None: done already)
    out: SamplerOutput | None = None  # sampled on the host
    failed: dict[int, str] = field(default_factory=dict)


class ModelRunner:
    def __init__(self, model: DecoderForCausalLM, kv_cache: KVCache, backend: Backend,
                 tables: DecodeTables | None = None) -> None:
        """``tables``: decode steps' block tables kept between steps (``DecodeTables``); None: every
        step's table is built from its requests' block lists."""
        self.model = model
        self.tables = tables
        self.kv_cache = kv_cache
        self.backend = backend
        self.attention = backend.attention(kv_cache)
        self.sampler = Sampler()
        self.device = backend.device
        self.fault_hook: Callable[[str, torch.Tensor | None], None] | None = None

    def execute(self, step: SchedulerOutput, rows: Sequence[SamplingRow]) -> StepResult:
        """The sampled token of each scheduled request (None mid-prefill) and the prompt logprobs
        the step computed.

        ``rows`` holds the sampling settings of the requests that sample, in scheduled order.
        """
        return self.run(self.prepare(step, rows))

    def run(self, step: PreparedStep, previous_tokens: torch.Tensor | None = None) -> StepResult:
        """``launch`` then ``collect``."""
        return self.collect(self.launch(step, previous_tokens))

    def prepare(
        self, step: SchedulerOutput, rows: Sequence[SamplingRow], previous: Mapping[int, int] | None = None,
        plain_greedy: bool | None = None,
    ) -> PreparedStep:
        """The host's part of a step: its flat inputs (``previous``: see ``build_step_inputs``).
        ``plain_greedy``: the caller knows whether every row is plain greedy (None: each row is looked at)."""
        return PreparedStep(self.step_inputs(step, previous), rows, len(step.scheduled), plain_greedy)

    def step_inputs(self, step: SchedulerOutput, previous: Mapping[int, int] | None = None) -> StepInputs:
        """The step's flat inputs (``build_step_inputs``; decode steps from the kept block tables)."""
        return build_step_inputs(step.scheduled, self.kv_cache.block_size, self.device, previous, self.tables)

    @torch.inference_mode()
    def launch(self, step: PreparedStep, previous_tokens: torch.Tensor | None = None) -> LaunchedRun:
        """The device's part: the forward and the sampling, without waiting for the device where
        the rows allow (plain greedy: the pick stays on the device). ``previous_tokens``: [S'] the
        step before's ``LaunchedRun.tokens``, when this one reads pending tokens from it."""
        inputs, rows = step.inputs, step.rows
        if inputs.previous_rows:
            assert previous_tokens is not None, "the step reads tokens of a step that has no results"
            at = host_int64(inputs.previous_index).to(previous_tokens.device)
            rows_at = host_int64(inputs.previous_rows).to(self.device)
            inputs.input_ids[rows_at] = previous_tokens[at].to(self.device)
        attention = self.attention.bind(inputs.attention)
        if self.fault_hook is not None:
            self.fault_hook("forward", None)
        hidden = self.backend.forward(self.model, inputs.input_ids, inputs.positions, attention)
        run = LaunchedRun(step, {p.request: self._score_prompt(hidden, p) for p in inputs.prompt_rows})
        if not inputs.sampling_requests:
            run.ready = self.backend.step_launched()
            return run
        logits = self.model.compute_logits(hidden[inputs.logits_indices])  # [S, V] float32
        if self.fault_hook is not None:
            self.fault_hook("logits", logits)
        plain = step.plain_greedy if step.plain_greedy is not None else plain_greedy(rows)
        # plain greedy rows: every argmax and the finiteness check in one pass, where the backend can
        picked = self.backend.greedy_pick(logits) if plain else None
        # a row holding NaN or inf is drawn like the others and fails when collected
        drawable = picked is None and (step.drawn or drawn_on_device(rows, logits.shape[1]))
        if drawable and self.backend.draws_tokens:  # one pass over the logits, where the backend can
            params = rows.params() if isinstance(rows, PlainRows) else [r.params for r in rows]
            picked = self.backend.draw_tokens(logits, *draw_columns(params, logits.device))
        if picked is None and isinstance(rows, PlainRows):
            rows = list(rows)  # a PlainRows builds a row on every read: once, for the torch paths' passes
        if picked is None and drawable:
            picked = sample_on_device(logits, rows), torch.isfinite(logits.sum(dim=-1))
        if picked is not None:
            run.tokens, run.finite = picked
            if run.tokens.is_cuda:  # to the host behind the step's event: collecting waits for this step only
                run.host = torch.empty((2, run.tokens.shape[0]), dtype=torch.int64, pin_memory=True)
                run.host[0].copy_(run.tokens, non_blocking=True)
                run.host[1].copy_(run.finite, non_blocking=True)
            run.ready = self.backend.step_launched()
            return run
        finite = _finite_rows(logits)
        bad = [j for j, ok in enumerate(finite) if not ok] if finite is not None else []  # NaN or inf: not sampled
        for j in bad:
            run.failed[inputs.sampling_requests[j]] = "the model produced non-finite logits (NaN or inf)"
        if bad:
            logits[bad] = 0.0  # sampled below like any row; the result is discarded
        run.out = self.sampler(logits, rows)
        run.tokens = torch.tensor(run.out.token_ids, dtype=torch.int64, device=logits.device)
        run.ready = self.backend.step_launched()
        return run

    def collect(self, run: LaunchedRun) -> StepResult:
        """The step's results on the host (waits for the device where the step left them there)."""
        step, inputs, rows = run.step, run.step.inputs, run.step.rows
        result = StepResult([None] * step.num_scheduled, run.prompt, run.failed)
        if run.ready is not None:
            run.ready.synchronize()
        if not inputs.sampling_requests:
            return result
        out = run.out
        if out is None:  # tokens chosen on the device
            assert run.tokens is not None and run.finite is not None
            if run.host is not None:
                token_ids, finite_rows = run.host.tolist()
                finite = None if all(finite_rows) else [bool(f) for f in finite_rows]
            else:
                finite = None if bool(run.finite.all()) else run.finite.tolist()
                token_ids = run.tokens.tolist()
            for j, ok in enumerate(finite or ()):
                if not ok:  # NaN or inf: not sampled
                    result.failed[inputs.sampling_requests[j]] = "the model produced non-finite logits (NaN or inf)"
            out = SamplerOutput(token_ids=token_ids, logprobs=None, top_logprobs=None)
        self._results(out, inputs, rows, result)
        return result

    @staticmethod
    def _results(out: SamplerOutput, inputs: StepInputs, rows: Sequence[SamplingRow], result: StepResult) -> None:
        """The sampled tokens (and logprobs) into ``result``, per scheduled request and per draft row."""
        results, failed = result.sampled, result.failed
        if not failed and out.logprobs is None and len(out.token_ids) == len(set(inputs.sampling_requests)):
            # no failed row, no logprobs, no draft rows: one token per request
            result.row_tokens.extend(out.token_ids)
            if len(out.token_ids) == len(results):  # every scheduled request, in order (rows ascend)
                result.plain = True
                return
            for i, token in zip(inputs.sampling_requests, out.token_ids, strict=True):
                results[i] = SampledToken(token, None)
            return
        result.row_tokens.extend(0 if i in failed else t for i, t in zip(inputs.sampling_requests, out.token_ids, strict=True))
        previous = -1
        for j, i in enumerate(inputs.sampling_requests):
            if i in failed:
                continue
            token = out.token_ids[j]
            logprobs = None
            if rows[j].params.logprobs is not None:
                logprobs = {token: out.logprobs[j]}
                for tid, lp in out.top_logprobs[j] or ():
                    logprobs.setdefault(tid, lp)
            if i == previous:  # a draft row: the request's rows are consecutive
                result.draft_samples.setdefault(i, []).append(SampledToken(token, logprobs))
            else:
                results[i] = SampledToken(token, logprobs)
            previous = i

    def _score_prompt(self, hidden: torch.Tensor, rows: PromptRows) -> list[dict[int, float]]:
        """For each row: the logprob of the prompt token it predicts, then the top ``top_k``."""
        entries: list[dict[int, float]] = []
        for a in range(0, len(rows.targets), PROMPT_LOGITS_ROWS):
            targets = rows.targets[a : a + PROMPT_LOGITS_ROWS]
            h = hidden[rows.start + a : rows.start + a + len(targets)]  # [R, hidden]
            logprobs = torch.log_softmax(self.model.compute_logits(h), dim=-1)  # [R, V] float32
            index = torch.tensor(targets, dtype=torch.int64, device=logprobs.device)
            picked = logprobs.gather(1, index[:, None])[:, 0].tolist()
            if rows.top_k > 0:
                top = torch.topk(logprobs, min(rows.top_k, logprobs.shape[-1]), dim=-1)
                top_ids, top_values = top.indices.tolist(), top.values.tolist()
            else:
                top_ids = top_values = [[] for _ in targets]
            for target, lp, ids, values in zip(targets, picked, top_ids, top_values, strict=True):
                entry = {target: lp}
                for tid, value in zip(ids, values, strict=True):
                    entry.setdefault(tid, value)
                entries.append(entry)
        return entries


def _finite_rows(logits: torch.Tensor) -> list[bool] | None:
    """logits [S, V] -> whether each row's values are all finite; None when they all are (one sum)."""
    if bool(torch.isfinite(logits.sum())):
        return None
    return torch.isfinite(logits).all(dim=-1).tolist()
