"""`swiftlm serve | generate | chat | bench | top`: the command line.

Configs are built here, once, from the flags (``build_configs`` for ``serve``) and passed down.
Torch-heavy modules are imported inside the handlers so that ``swiftlm --help`` stays fast.
Errors a user can cause (bad flags, a model that cannot be loaded, a prompt that does not fit)
print one ``error: ...`` line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from swiftlm.cli_serve import add_serve_parser, build_configs, generation_overrides, parse_bytes  # noqa: F401 (parse_bytes: the CLI's API)
from swiftlm.config import DTYPE_CHOICES

if TYPE_CHECKING:
    from swiftlm.sampling import SamplingParams

CHAT_SESSION_ID = "cli-chat"
_DIM, _RESET = "\x1b[2m", "\x1b[0m"


# -- parser ------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swiftlm", description="Low-latency serving of small language models behind an OpenAI-compatible API."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,generate,chat,batch,bench,top}")
    add_serve_parser(sub, _run_serve)
    _add_generate(sub)
    _add_chat(sub)
    from swiftlm.cli_batch import add_batch_parser

    add_batch_parser(sub)
    from swiftlm.bench.cli import add_bench_parser

    add_bench_parser(sub)
    from swiftlm.top.command import add_top_parser

    add_top_parser(sub)
    return parser


def _add_model_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    p.add_argument("--model", help="model directory, .gguf file, Hugging Face hub id, or REPO:QUANT (a GGUF repo's "
                                    "file; default: the installed SmolLM2-135M-Instruct GGUF)")
    p.add_argument("--gguf-file", metavar="NAME", help="the GGUF file to load from the hub repo (or directory) MODEL")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto", help="weight dtype (default: auto)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: cpu)")
    p.add_argument("--max-model-len", type=int, help="context window in tokens (default: 8192 or the model's)")
    p.add_argument("--override-generation-config", metavar="JSON",
                   help="default sampling over the checkpoint's generation_config.json")
    s = p.add_argument_group("sampling (defaults: the checkpoint's generation_config.json)")
    s.add_argument("--max-tokens", type=int, default=max_tokens, help=f"tokens to generate (default: {max_tokens})")
    s.add_argument("--temperature", type=float, help="0 is greedy")
    s.add_argument("--top-p", type=float)
    s.add_argument("--top-k", type=int)
    s.add_argument("--seed", type=int, help="sampling seed")


def _add_generate(sub: Any) -> None:
    p = sub.add_parser("generate", help="complete one prompt (raw text, no chat template), streaming")
    _add_model_args(p, max_tokens=128)
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-tokens tokens")
    p.add_argument("--plain", action="store_true", help="use the plain reference path instead of the engine")
    p.add_argument("prompt", nargs="+", help="the prompt (words are joined with spaces)")
    p.set_defaults(func=_run_generate)


def _add_chat(sub: Any) -> None:
    p = sub.add_parser("chat", help="chat in the terminal (/reset clears the history, /exit or EOF ends)")
    _add_model_args(p, max_tokens=512)
    p.add_argument("--no-think", action="store_true", help="turn thinking off (enable_thinking=False)")
    p.add_argument("--system", metavar="TEXT", help="a system prompt")
    p.add_argument("--thinking-budget", type=int, metavar="N", help="end thinking after N reasoning tokens")
    p.set_defaults(func=_run_chat)


def _run_serve(args: argparse.Namespace) -> int:
    engine_config, server_config = build_configs(args)
    from swiftlm.server.launch import serve
    from swiftlm.server.vllm_flags import no_effect

    quantization = None if args.quantization == "none" else args.quantization
    from swiftlm.cluster.flags import cluster_config

    cluster = cluster_config(args, engine_config, server_config, quantization)
    if cluster is not None:  # --replicas: Ray Serve (imported only here)
        from swiftlm.cluster.launch import serve_cluster

        serve_cluster(cluster)
        return 0
    serve(engine_config, server_config, quantization, no_effect=no_effect(args))
    return 0


# -- generate and chat -------------------------------------------------------------------------
def _load(args: argparse.Namespace, plain: bool = False) -> tuple[Any, float]:
    """(LLM or PlainLLM, load seconds, imports excluded). One sequence at a time: the KV cache is sized for one."""
    from swiftlm.llm import LLM
    from swiftlm.plain import PlainLLM

    start = time.perf_counter()
    if plain:
        llm: Any = PlainLLM(args.model, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
                            gguf_file=args.gguf_file)
    else:
        extra: dict[str, Any] = {} if args.max_model_len is None else {"max_model_len": args.max_model_len}
        if args.gguf_file is not None:
            extra["gguf_file"] = args.gguf_file
        overrides = generation_overrides(args)
        if overrides:
            extra["generation_overrides"] = overrides
        llm = LLM(args.model, dtype=args.dtype, device=args.device, max_num_seqs=1, **extra)
        print(llm.engine.backend.describe(), file=sys.stderr)  # the device plan, once at start
    return llm, time.perf_counter() - start


def _sampling_params(llm: Any, args: argparse.Namespace, **fixed: Any) -> SamplingParams:
    """The checkpoint's defaults, then the sampling flags that were given."""
    flags = {k: getattr(args, k) for k in ("temperature", "top_p", "top_k", "seed") if getattr(args, k) is not None}
    return llm.default_sampling_params().with_updates(max_tokens=args.max_tokens, **flags, **fixed)


class _Timer:
    """TTFT and decode speed of one streamed generation."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first: float | None = None
        self.end = self.start
        self.tokens = 0

    def tokens_arrived(self, n: int) -> None:
        now = time.perf_counter()
        if n and self.first is None:
            self.first = now
        self.tokens += n
        self.end = now

    def summary(self) -> str:
        ttft = f"{(self.first - self.start) * 1e3:.1f} ms" if self.first is not None else "n/a"
        decode = self.end - (self.first or self.end)
        speed = f"{(self.tokens - 1) / decode:.1f} tok/s" if self.tokens > 1 and decode > 0 else "n/a"
        return f"generated {self.tokens} tokens | TTFT {ttft} | decode {speed}"


def _engine_deltas(llm: Any, prompt: Any, params: SamplingParams, session_id: str | None = None) -> Iterator[Any]:
    """(text delta, new token ids, RequestOutput) from ``LLM.stream``."""
    for out in llm.stream(prompt, params, session_id=session_id):
        if out.error:
            raise ValueError(f"the request failed: {out.error}")
        delta = out.outputs[0] if out.outputs else None
        yield (delta.text, delta.token_ids, out) if delta else ("", [], out)


def _plain_deltas(llm: Any, prompt_ids: list[int], params: SamplingParams) -> Iterator[tuple[str, list[int], None]]:
    """The same from ``PlainLLM.stream``, detokenized here."""
    from swiftlm.text.detokenizer import IncrementalDetokenizer

    detok = IncrementalDetokenizer(llm.tokenizer, prompt_ids, params.skip_special_tokens)
    for step in llm.stream(prompt_ids, params):
        yield detok.add(step.token_id), [step.token_id], None
    yield detok.flush(), [], None


def _run_generate(args: argparse.Namespace) -> int:
    llm, load_s = _load(args, plain=args.plain)
    params = _sampling_params(llm, args, ignore_eos=args.ignore_eos)
    prompt = " ".join(args.prompt)
    prompt_ids = llm.tokenizer.encode(prompt)
    timer = _Timer()
    deltas = _plain_deltas(llm, prompt_ids, params) if args.plain else _engine_deltas(
        llm, {"prompt": prompt, "prompt_token_ids": prompt_ids}, params
    )
    for text, new_ids, _ in deltas:
        timer.tokens_arrived(len(new_ids))
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    print(f"load {load_s:.2f}s | prompt {len(prompt_ids)} tokens | {timer.summary()}", file=sys.stderr)
    return 0


class _TurnPrinter:
    """Writes a streamed answer: the reasoning dimmed (or prefixed when not a terminal), then the answer."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.tty = out.isatty()
        self.in_reasoning = False

    def reasoning(self, text: str) -> None:
        if text and not self.in_reasoning:
            self.out.write(_DIM if self.tty else "[thinking] ")
            self.in_reasoning = True
        self._write(text)

    def content(self, text: str) -> None:
        if text and self.in_reasoning:
            self._end_reasoning()
        self._write(text)

    def finish(self) -> None:
        if self.in_reasoning:
            self._end_reasoning()
        self._write("\n")

    def _end_reasoning(self) -> None:
        self.out.write((_RESET if self.tty else "") + "\n\n")
        self.in_reasoning = False

    def _write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()


def _chat_turn(
    llm: Any, messages: list[dict[str, Any]], enable_thinking: bool | None, params: SamplingParams
) -> str:
    """Stream one assistant turn to stdout, stats to stderr; return the answer (content only).

    The turn runs in the chat's session, and is recorded with it, so the next turn's prompt
    extends the real token stream and reuses its KV. ``enable_thinking`` is the top-level
    switch of ``resolve_thinking`` (None: not asked).
    """
    from swiftlm.core.outputs import CompletionOutput, RequestOutput
    from swiftlm.frontend.answer import AnswerStream

    prompt = llm.chat_prompt(messages, session_id=CHAT_SESSION_ID, enable_thinking=enable_thinking)
    parser = AnswerStream(separate=prompt["thinking"])
    printer = _TurnPrinter(sys.stdout)
    timer = _Timer()
    answer, text, token_ids = [], [], []
    last = None
    try:
        for delta, new_ids, out in _engine_deltas(llm, prompt, params, session_id=CHAT_SESSION_ID):
            last = out
            timer.tokens_arrived(len(new_ids))
            token_ids.extend(new_ids)
            text.append(delta)
            reasoning, items = parser.feed(delta)
            content = "".join(item.content for item in items)
            printer.reasoning(reasoning)
            printer.content(content)
            answer.append(content)
        printer.reasoning(parser.feed("", finished=True)[0])
    finally:
        printer.finish()
    if last is None:
        return ""
    whole = CompletionOutput(index=0, text="".join(text), token_ids=token_ids)
    llm.record_turn(
        CHAT_SESSION_ID,
        messages,
        prompt,
        RequestOutput(last.request_id, last.prompt, last.prompt_token_ids, [whole], finished=True),
    )
    print(
        f"[prompt {len(last.prompt_token_ids)} tokens, cached {last.num_cached_tokens} | {timer.summary()}]",
        file=sys.stderr,
    )
    return "".join(answer)


def _run_chat(args: argparse.Namespace) -> int:
    llm, load_s = _load(args)
    params = _sampling_params(llm, args, thinking_budget=args.thinking_budget)
    enable_thinking = False if args.no_think else None
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    interactive = sys.stdin.isatty()
    print(f"loaded {args.model} in {load_s:.2f}s; /reset clears the history, /exit ends", file=sys.stderr)
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        command = line.strip()
        if not command:
            continue
        if command == "/exit":
            break
        if command == "/reset":
            messages = list(system)
            llm.close_session(CHAT_SESSION_ID)
            print("[history cleared]", file=sys.stderr)
            continue
        messages.append({"role": "user", "content": line})
        try:
            answer = _chat_turn(llm, messages, enable_thinking, params)
        except ValueError as exc:  # e.g. the conversation no longer fits the context window
            messages.pop()
            print(f"error: {exc}", file=sys.stderr)
            continue
        except KeyboardInterrupt:
            messages.pop()
            print("[interrupted]", file=sys.stderr)
            continue
        messages.append({"role": "assistant", "content": answer})
    return 0


# -- entry point -------------------------------------------------------------------------------
def apply_default_model(args: argparse.Namespace) -> None:
    """Without a model argument: the installed default model, with its served name (serve) and
    its sampling defaults (unless --override-generation-config gives others)."""
    if args.model is not None:
        return
    from swiftlm.model import default_model

    args.model = default_model.require_default_model()
    if args.command == "serve" and not args.served_model_name:
        args.served_model_name = [default_model.SERVED_NAME]
    if getattr(args, "override_generation_config", None) is None:
        args.override_generation_config = json.dumps(default_model.GENERATION_DEFAULTS)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("serve", "generate", "chat"):
        apply_default_model(args)
        from swiftlm.threads import pin_cpu_threads_env

        pin_cpu_threads_env()
    try:
        return int(args.func(args) or 0)
    except ValueError as exc:  # ConfigError, LoadError, RequestError, bad sampling values
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
