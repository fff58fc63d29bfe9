"""`swiftlm serve | generate | chat | bench | top`: the command line.

Configs are built here, once, from the flags (``build_configs`` for ``serve``) and passed down.
Torch-heavy modules are imported inside the handlers so that ``swiftlm --help`` stays fast.
Errors a user can cause (bad flags, a model that cannot be loaded, a prompt that does not fit)
print one ``error: ...`` line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from swiftlm.config import (
    DTYPE_CHOICES,
    KV_CACHE_DTYPES,
    CacheConfig,
    EngineConfig,
    SchedulerConfig,
    ServerConfig,
    SpeculativeConfig,
    parse_json_object,
)

if TYPE_CHECKING:
    from swiftlm.sampling import SamplingParams

CHAT_SESSION_ID = "cli-chat"
_BYTE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "kb": 10**3, "mb": 10**6, "gb": 10**9,
               "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_DIM, _RESET = "\x1b[2m", "\x1b[0m"


def parse_bytes(text: str) -> int:
    """``2147483648``, ``2GiB``, ``512MiB``, ``1.5G`` (binary), ``2GB`` (decimal) -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _BYTE_UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; use bytes or e.g. 512MiB, 2GiB")
    return int(float(match.group(1)) * _BYTE_UNITS[unit])


# -- parser ------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swiftlm", description="Low-latency serving of small language models behind an OpenAI-compatible API."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,generate,chat,batch,bench,top}")
    _add_serve(sub)
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


def _add_serve(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve a model behind an OpenAI-compatible HTTP API")
    p.add_argument("model", nargs="?",
                   help="model directory, .gguf file, Hugging Face hub id, or REPO:QUANT (a GGUF repo's file; "
                        "default: the installed SmolLM2-135M-Instruct GGUF)")
    e = p.add_argument_group("engine")
    e.add_argument("--gguf-file", metavar="NAME", help="the GGUF file to load from the hub repo (or directory) MODEL")
    e.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto", help="weight dtype (default: auto)")
    e.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: cpu)")
    e.add_argument("--quantization", choices=("none", "int8", "int4"), default="none", help="weight quantization")
    e.add_argument("--cpu-kernels", action=argparse.BooleanOptionalAction, default=True,
                   help="swiftlm's compiled CPU kernels where they build (default: on; off: plain torch ops)")
    e.add_argument("--cpu-prepack", choices=("auto", "on", "off"), default="auto",
                   help="oneDNN-packed weight copies: auto = only where the bf16 GEMV kernel does not run; "
                        "on = also next to it (faster batched decode, twice the weight memory)")
    e.add_argument("--override-generation-config", metavar="JSON",
                   help='default sampling over the checkpoint\'s generation_config.json, e.g. \'{"temperature": 0.2}\'')
    e.add_argument("--max-model-len", type=int, default=8192, help="context window in tokens (default: 8192)")
    e.add_argument("--block-size", type=int, default=None,
                   help="KV cache block size in tokens (default: the backend's: 16; on a CPU 32 with an 8-bit "
                        "--kv-cache-dtype)")
    e.add_argument("--kv-cache-memory", type=parse_bytes, metavar="BYTES",
                   help="KV cache size, e.g. 2GiB (default: a share of free memory)")
    e.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="K/V storage: auto = the model's dtype; int8, fp8 (= fp8_e4m3), fp8_e5m2 = 8 bits with a "
                        "scale per token and head (half the memory and the bytes decode reads)")
    e.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the KV of shared prompt prefixes (default: on)")
    e.add_argument("--session-ttl", type=float, default=600.0, metavar="SECONDS",
                   help="how long an idle session keeps its KV (default: 600)")
    e.add_argument("--max-session-tokens", type=int, help="KV tokens all sessions may pin (default: half the cache)")
    e.add_argument("--max-num-seqs", type=int, default=32, help="requests running at once (default: 32)")
    e.add_argument("--max-num-batched-tokens", type=int, default=512, help="token budget per step (default: 512)")
    e.add_argument("--max-queued-requests", type=int, default=256, help="waiting requests before 429 (default: 256)")
    e.add_argument("--max-queue-wait", type=float, metavar="SECONDS", help="refuse requests that waited longer")
    h = p.add_argument_group("server")
    h.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    h.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    h.add_argument("--api-key", help="require this bearer token (default: $SWIFTLM_API_KEY, else none)")
    h.add_argument("--served-model-name", nargs="+", metavar="NAME",
                   help="the names clients may use, the first one reported (default: MODEL as given)")
    h.add_argument("--default-chat-template-kwargs", metavar="JSON",
                   help='chat template kwargs for every request, e.g. \'{"enable_thinking": false}\'')
    h.add_argument("--max-n", type=int, default=16, help="largest n a request may ask for (default: 16)")
    h.add_argument("--max-request-bytes", type=parse_bytes, default=16 * 1024 * 1024, metavar="BYTES",
                   help="larger request bodies are refused with 413 (default: 16MiB; uploads: --max-batch-file-bytes)")
    h.add_argument("--api-key-file", metavar="FILE",
                   help="accepted keys, one per line: KEY [name=NAME] [rpm=N] [tpm=N] ('#' starts a comment)")
    h.add_argument("--default-rpm", type=int, metavar="N", help="requests per minute for each key without its own")
    h.add_argument("--default-tpm", type=int, metavar="N",
                   help="tokens (prompt + generated) per minute for each key without its own")
    h.add_argument("--request-receive-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="a request's headers and body must arrive within this (else 408; default: 60)")
    h.add_argument("--timeout-keep-alive", type=float, default=5.0, metavar="SECONDS",
                   help="close idle keep-alive connections after this (default: 5)")
    h.add_argument("--max-concurrent-connections", type=int, metavar="N",
                   help="connections beyond this get a 503 (default: no limit)")
    h.add_argument("--enable-debug-endpoints", action="store_true",
                   help="serve GET /debug/kv (KV pool integrity and block accounting)")
    h.add_argument("--log-level", choices=("debug", "info", "warning", "error", "critical"), default="info")
    h.add_argument("--no-ui", "--no-webui", dest="no_ui", action="store_true", help="do not serve the web playground at /")
    h.add_argument("--metric-names", choices=("swiftlm", "vllm"), default="swiftlm",
                   help="vllm: /metrics also exports vLLM's names (vllm:...) of the metrics that mean the same")
    t = p.add_argument_group("thinking and the response cache")
    t.add_argument("--default-thinking", choices=("auto", "on", "off"),
                   help="thinking for requests that do not choose: auto = the rule set decides per question "
                        "(see --thinking-rules); default: on (Qwen3's)")
    t.add_argument("--thinking-rules", metavar="FILE",
                   help='the rule set for enable_thinking "auto", a JSON file (default: swiftlm\'s own, '
                        "swiftlm/text/thinking_rules.json)")
    t.add_argument("--auto-thinking-budget", type=int, metavar="N",
                   help='reasoning tokens allowed when "auto" turns thinking on and the request sets no budget')
    t.add_argument("--response-cache", metavar="STORE",
                   help="answer repeated deterministic requests (greedy or with a seed) from a cache: memory, "
                        "or sqlite:PATH (kept across restarts); default: off")
    t.add_argument("--response-cache-ttl", type=float, default=3600.0, metavar="SECONDS",
                   help="serve cached answers at most this old (default: 3600)")
    t.add_argument("--response-cache-max-entries", type=int, default=10000, metavar="N",
                   help="keep at most N answers, dropping the least recently used (default: 10000)")
    t.add_argument("--response-cache-max-bytes", type=parse_bytes, default=256 * 1024 * 1024, metavar="BYTES",
                   help="keep at most this many bytes of answers, dropping the least recently used (default: 256MiB)")
    b = p.add_argument_group("Batch API")
    b.add_argument("--disable-batch-api", action="store_true", help="do not serve /v1/files and /v1/batches (404)")
    b.add_argument("--batch-storage-dir", metavar="DIR",
                   help="where jobs, their lines and files are kept (default: ~/.cache/swiftlm/batches/port-PORT)")
    b.add_argument("--batch-retention-hours", type=float, default=168.0, metavar="HOURS",
                   help="delete finished jobs and their files after this long (default: 168)")
    b.add_argument("--response-retention-hours", type=float, default=720.0, metavar="HOURS",
                   help="delete stored Responses API responses after this long (kept in --batch-storage-dir; default: 720)")
    b.add_argument("--max-batch-file-bytes", type=parse_bytes, default=200 * 1024 * 1024, metavar="BYTES",
                   help="largest upload or inline batch (default: 200MiB; larger: 413)")
    from swiftlm.cluster.flags import add_cluster_flags
    from swiftlm.server.vllm_flags import add_vllm_flags

    add_cluster_flags(p)
    add_vllm_flags(p)
    p.set_defaults(func=_run_serve)


# -- serve -------------------------------------------------------------------------------------
def build_configs(args: argparse.Namespace) -> tuple[EngineConfig, ServerConfig]:
    """The engine and server configs that ``swiftlm serve`` flags describe (raises ConfigError)."""
    from swiftlm.server.operations.api_keys import read_api_key_file
    from swiftlm.server.vllm_flags import check_vllm_flags, max_queue_wait, read_chat_template

    check_vllm_flags(args)
    cache = CacheConfig(
        block_size=args.block_size,
        kv_cache_memory=args.kv_cache_memory,
        kv_cache_dtype=args.kv_cache_dtype,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=args.enable_prefix_caching,
        session_ttl=args.session_ttl,
        max_session_tokens=args.max_session_tokens,
    )
    scheduler = SchedulerConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        max_queued_requests=args.max_queued_requests,
        max_queue_wait=max_queue_wait(args),
        scheduling_policy=args.scheduling_policy,
    )
    engine = EngineConfig(
        model=args.model, dtype=args.dtype, device=args.device, cache=cache, scheduler=scheduler,
        cpu_kernels=args.cpu_kernels, cpu_prepack={"auto": None, "on": True, "off": False}[args.cpu_prepack],
        chat_template=read_chat_template(args.chat_template), gguf_file=args.gguf_file,
        generation_overrides=_generation_overrides(args),
        speculative=SpeculativeConfig.parse(args.speculative_config),
        enforce_eager=args.enforce_eager, async_scheduling=args.async_scheduling,
    )
    template_kwargs = {}
    if args.default_chat_template_kwargs is not None:
        template_kwargs = parse_json_object(args.default_chat_template_kwargs, "--default-chat-template-kwargs")
    server = ServerConfig(
        host=args.host,
        port=args.port,
        api_key=args.api_key or os.environ.get("SWIFTLM_API_KEY") or None,
        served_model_names=tuple(args.served_model_name or ()),
        default_chat_template_kwargs=template_kwargs,
        default_thinking=args.default_thinking,
        thinking_rules_path=_checked_thinking_rules(args.thinking_rules),
        auto_thinking_budget=args.auto_thinking_budget,
        response_cache=args.response_cache,
        response_cache_ttl_s=args.response_cache_ttl,
        response_cache_max_entries=args.response_cache_max_entries,
        response_cache_max_bytes=args.response_cache_max_bytes,
        max_n=args.max_n,
        log_level=args.log_level,
        reasoning_parser=args.reasoning_parser,
        tool_call_parser=args.tool_call_parser or "hermes",
        max_request_bytes=args.max_request_bytes,
        api_keys=read_api_key_file(args.api_key_file) if args.api_key_file else (),
        default_rpm=args.default_rpm,
        default_tpm=args.default_tpm,
        request_receive_timeout_s=args.request_receive_timeout,
        timeout_keep_alive_s=args.timeout_keep_alive,
        max_concurrent_connections=args.max_concurrent_connections,
        enable_debug_endpoints=args.enable_debug_endpoints,
        enable_ui=not args.no_ui,
        metric_names=args.metric_names,
        allowed_origins=tuple(args.allowed_origins),
        allowed_methods=tuple(args.allowed_methods),
        allowed_headers=tuple(args.allowed_headers),
        allow_credentials=args.allow_credentials,
        enable_batch_api=not args.disable_batch_api,
        batch_storage_dir=args.batch_storage_dir,
        batch_retention_hours=args.batch_retention_hours,
        response_retention_hours=args.response_retention_hours,
        max_batch_file_bytes=args.max_batch_file_bytes,
    )
    return engine, server


def _checked_thinking_rules(path: str | None) -> str | None:
    """``--thinking-rules``, read once here so that a bad file stops the server before it starts."""
    if path is not None:
        from swiftlm.text.thinking_rules import load_thinking_rules

        load_thinking_rules(path)
    return path


def _generation_overrides(args: argparse.Namespace) -> dict[str, Any]:
    text = getattr(args, "override_generation_config", None)
    return parse_json_object(text, "--override-generation-config") if text else {}


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
        overrides = _generation_overrides(args)
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
