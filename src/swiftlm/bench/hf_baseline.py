"""`swiftlm bench hf`: the same workload served in-process by Hugging Face transformers, the
baseline of the peer table (`swiftlm bench peers`).

How requests are served. Requests go in workload order, in static batches of up to C (the
concurrency) consecutive requests: one left-padded `model.generate` call per batch, the next
batch starting when the previous one returns. A batch is cut early where the generation settings
change. `max_new_tokens` is the largest max_tokens in the batch (each request is cut to its own);
with ``ignore_eos`` (or ``min_tokens``) `min_new_tokens` keeps EOS out until then.

When a request's clock starts (`arrival`):

- ``closed`` (default): when its batch starts. This is `bench serve`'s closed loop of C clients,
  each sending its next request when its last one returned: with static batches all C return at
  the batch's end and the next C go together. Comparable with `bench serve` numbers.
- ``at-once``: at t = 0 for every request (all of a level arrive together), so a later batch's
  times include its wait behind the earlier ones.

How it is timed, without a streamer. A `StoppingCriteria` (`_StepClock`) that never stops
anything rides along: `generate` calls it once per step, right after the step's new tokens are
appended to the batch, so its first call is the moment the batch's first tokens exist (prefill
plus the first sample) and its later calls are the moments of the following tokens. Per request
(from its clock's start):

- ``ttft`` = the batch's first step;
- ``itl`` = the gaps between the steps of its own tokens;
- ``latency`` = the batch's end (`generate` returned; static batching answers all at once);
- ``completion_tokens`` = its tokens up to and including the first EOS, at most its max_tokens.

Requests are rendered as `bench serve`'s server would: chat messages through the tokenizer's
chat template with ``enable_thinking`` from the request (``enable_thinking`` or
``chat_template_kwargs`` in its sampling or in --extra-body; False when absent), completions as
raw text. Sampling fields left out fall back to generation_config.json, as in swiftlm. The
``chat`` workload is refused: its turns need earlier replies, which a batch cannot wait for.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from swiftlm.bench.client import RunResult
from swiftlm.bench.sender import RequestRecord
from swiftlm.bench.workloads import BenchRequest, build_workload

ARRIVALS = ("closed", "at-once")

# Request fields that change nothing here (transport, or another server's names for sampling).
_NO_OPS = frozenset({"stream", "stream_options", "model", "session_id", "request_id", "user"})


@dataclass(frozen=True)
class Generation:
    """What one batch shares: `generate` kwargs, chat template kwargs and the EOS policy."""

    kwargs: tuple[tuple[str, Any], ...]
    template: tuple[tuple[str, Any], ...]
    ignore_eos: bool
    min_tokens: int
    seed: int | None
    ignored: tuple[str, ...]


def generation_for(request: BenchRequest, overrides: Mapping[str, Any]) -> Generation:
    """Map a request's OpenAI-style fields (its sampling, then `overrides`) to transformers'."""
    fields = {**request.sampling, **overrides}
    kwargs: dict[str, Any] = {}
    template: dict[str, Any] = {"enable_thinking": False}
    ignored = []
    for name, value in fields.items():
        if name == "temperature" and value is not None:
            kwargs.update({"do_sample": False} if value == 0 else {"do_sample": True, "temperature": value})
        elif name in ("top_p", "min_p", "repetition_penalty") and value is not None:
            kwargs[name] = value
        elif name == "top_k" and value is not None:
            kwargs["top_k"] = 0 if value < 1 else value
        elif name == "enable_thinking":
            template["enable_thinking"] = bool(value)
        elif name == "chat_template_kwargs":
            template.update(value or {})
        elif name not in ("ignore_eos", "min_tokens", "seed", "max_tokens") and name not in _NO_OPS:
            ignored.append(name)
    return Generation(
        tuple(sorted(kwargs.items())),
        tuple(sorted(template.items())),
        bool(fields.get("ignore_eos", False)),
        int(fields.get("min_tokens") or 0),
        fields.get("seed"),
        tuple(sorted(ignored)),
    )


def batches(
    requests: Sequence[BenchRequest], concurrency: int, overrides: Mapping[str, Any]
) -> Iterator[tuple[list[int], Generation]]:
    """Indices of consecutive requests, at most `concurrency` per batch, sharing one Generation."""
    current: list[int] = []
    gen: Generation | None = None
    for i, request in enumerate(requests):
        g = generation_for(request, overrides)
        if current and (len(current) == concurrency or g != gen):
            yield current, gen  # type: ignore[misc]
            current = []
        current.append(i)
        gen = g
    if current:
        yield current, gen  # type: ignore[misc]


class _StepClock:
    """A StoppingCriteria that stops nothing and notes when each step's tokens were appended."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class HFBaseline:
    """A transformers model and tokenizer, loaded once, serving workloads in static batches."""

    def __init__(self, model_dir: str, dtype: str = "auto", threads: int = 2) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads)
        self.model_dir = model_dir
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer.padding_side = "left"
        torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).eval()
        config = self.model.generation_config
        eos = config.eos_token_id if config.eos_token_id is not None else self.tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else min(self.eos_ids)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token_id = self.pad_id
        self.dtype = str(self.model.dtype).removeprefix("torch.")
        with torch.inference_mode():  # first-call costs (allocator, kernel choice) stay out of runs
            ids = self.tokenizer("warm up", return_tensors="pt")
            self.model.generate(**ids, max_new_tokens=2, do_sample=False, pad_token_id=self.pad_id)

    def render(self, request: BenchRequest, gen: Generation) -> str:
        if request.kind == "completion":
            return request.prompt or ""
        messages = [{"role": r, "content": c} for r, c in request.messages]
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **dict(gen.template)
        )

    def run(
        self,
        requests: Sequence[BenchRequest],
        concurrency: int,
        warmup: Sequence[BenchRequest] = (),
        overrides: Mapping[str, Any] | None = None,
        arrival: str = "closed",
        show_progress: bool = False,
    ) -> RunResult:
        """Serve `requests` as the module docstring says; `warmup` goes first, unrecorded."""
        from tqdm import tqdm

        if arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {ARRIVALS}, got {arrival!r}")
        overrides = overrides or {}
        if any(r.session_id is not None or r.turn for r in requests):
            raise ValueError(
                "the HF baseline serves independent requests; the chat workload's turns need earlier replies"
            )
        for indices, gen in batches(warmup, concurrency, overrides):
            self._generate([warmup[i] for i in indices], gen, 0.0)
        records: list[RequestRecord] = [RequestRecord(i, r.kind) for i, r in enumerate(requests)]
        bar = tqdm(
            total=len(requests),
            desc=f"hf concurrency {concurrency}",
            unit="req",
            disable=not show_progress,
            leave=False,
        )
        t0 = time.perf_counter()
        for indices, gen in batches(requests, concurrency, overrides):
            batch = [requests[i] for i in indices]
            batch_start = time.perf_counter()
            origin = batch_start if arrival == "closed" else t0
            for i, record in zip(indices, self._generate(batch, gen, origin), strict=True):
                records[i] = dataclasses.replace(record, index=i, start=origin - t0)
            bar.update(len(indices))
        duration = time.perf_counter() - t0
        bar.close()
        return RunResult(concurrency, tuple(records), duration, self.model_dir)

    def _generate(self, batch: Sequence[BenchRequest], gen: Generation, origin: float) -> list[RequestRecord]:
        """Records of one batch, with times from `origin` (a perf_counter value)."""
        enc = self.tokenizer(
            [self.render(r, gen) for r in batch], return_tensors="pt", padding=True, add_special_tokens=False
        )
        max_new = max(r.max_tokens for r in batch)
        min_new = max_new if gen.ignore_eos else min(gen.min_tokens, max_new)
        clock = _StepClock()
        if gen.seed is not None:
            torch.manual_seed(gen.seed)
        with torch.inference_mode():
            out = self.model.generate(
                **enc,
                **dict(gen.kwargs),
                max_new_tokens=max_new,
                min_new_tokens=min_new or None,
                pad_token_id=self.pad_id,
                stopping_criteria=[clock],
            )
        end = time.perf_counter()
        new = out[:, enc["input_ids"].shape[1] :].tolist()  # (batch, generated steps)
        prompt_lens = enc["attention_mask"].sum(dim=1).tolist()
        records = []
        for row, request, tokens, prompt_len in zip(range(len(batch)), batch, new, prompt_lens, strict=True):
            n = min(request.max_tokens, len(tokens))
            if not gen.ignore_eos:
                stop = next((k for k, t in enumerate(tokens) if t in self.eos_ids and k >= min_new), None)
                n = min(n, stop + 1) if stop is not None else n
            steps = clock.times[:n]
            records.append(
                RequestRecord(
                    row,
                    request.kind,
                    request.conversation_id,
                    request.turn,
                    ok=True,
                    status=200,
                    ttft=steps[0] - origin if steps else None,
                    latency=end - origin,
                    itl=[b - a for a, b in zip(steps, steps[1:], strict=False)],
                    prompt_tokens=int(prompt_len),
                    completion_tokens=n,
                    usage_reported=True,
                    output_chars=len(self.tokenizer.decode(tokens[:n], skip_special_tokens=True)),
                )
            )
        return records


def hf_command(args: argparse.Namespace) -> int:
    """`swiftlm bench hf`: run the workload at each concurrency level; write the reports that
    `bench serve` writes (results.json, results.md, plots)."""
    from swiftlm.bench.commands import (
        UsageError,
        _extra_body,
        _output_dir,
        _token_counter,
        _workload_options,
        write_reports,
    )
    from swiftlm.bench.report import summarize

    if not args.model:
        raise UsageError("bench hf needs --model: the checkpoint directory to load")
    if args.duration:
        raise UsageError("bench hf serves a request count; use --num-requests instead of --duration")
    if args.workload == "chat":
        raise UsageError(
            "bench hf cannot run the chat workload (its turns need earlier replies); pick another"
        )
    try:
        levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    except ValueError as exc:
        raise UsageError(f"--concurrency takes comma-separated integers, got {args.concurrency!r}") from exc
    if not levels or min(levels) < 1:
        raise UsageError(f"--concurrency levels must be at least 1, got {args.concurrency!r}")
    options, extra = _workload_options(args), _extra_body(args.extra_body)
    count, counter_name = _token_counter(args, [args.model])
    num = args.num_requests if args.num_requests is not None else 64
    baseline = HFBaseline(args.model, args.dtype, args.threads)
    runs = []
    for i, c in enumerate(levels):  # the same seeds per level as `bench serve`, so the same requests
        requests = build_workload(args.workload, num, args.seed + i, count, options, f"hf-c{c}")
        warmup = build_workload(
            args.workload, args.warmup, args.seed + 100_000 + i, count, options, f"hf-w{c}"
        )
        ignored = sorted({name for r in requests for name in generation_for(r, extra).ignored})
        if ignored and i == 0:
            print(
                f"note: the HF baseline has no equivalent of {', '.join(ignored)}; ignored", file=sys.stderr
            )
        run = baseline.run(requests, c, warmup, extra, args.arrival, show_progress=not args.no_progress)
        runs.append(run)
        s = summarize(run.records, run.duration_s)
        print(
            f"concurrency {c}: {s['num_ok']}/{s['num_requests']} ok, {s['requests_per_s']:.2f} req/s, "
            f"{s['output_tokens_per_s']:.1f} output tok/s",
            file=sys.stderr,
        )
    meta = {
        "engine": "transformers (in-process, static batches)",
        "model": args.model,
        "dtype": baseline.dtype,
        "threads": args.threads,
        "arrival": args.arrival,
        "workload": args.workload,
        "requests": f"{num} per level",
        "seed": args.seed,
        "options": dataclasses.asdict(options),
        "extra_body": extra,
        "token_counter": counter_name,
        "torch": torch.__version__,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    write_reports(runs, meta, _output_dir(args, "hf"), plots=not args.no_plots)
    return 0
