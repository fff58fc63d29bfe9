"""``swiftlm serve``'s flags and the configs built from them, once (``build_configs``), passed down.
``swiftlm.cli`` adds this parser beside the other commands' and runs the server."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from typing import Any

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

_BYTE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "kb": 10**3, "mb": 10**6, "gb": 10**9,
               "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``2147483648``, ``2GiB``, ``512MiB``, ``1.5G`` (binary), ``2GB`` (decimal) -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _BYTE_UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; use bytes or e.g. 512MiB, 2GiB")
    return int(float(match.group(1)) * _BYTE_UNITS[unit])


def add_serve_parser(sub: Any, run: Callable[[argparse.Namespace], int]) -> None:
    """``serve``'s subparser; ``run`` starts the server from the parsed flags."""
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
    p.set_defaults(func=run)


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
        generation_overrides=generation_overrides(args),
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


def generation_overrides(args: argparse.Namespace) -> dict[str, Any]:
    text = getattr(args, "override_generation_config", None)
    return parse_json_object(text, "--override-generation-config") if text else {}
