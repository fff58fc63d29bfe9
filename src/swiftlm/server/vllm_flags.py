"""vLLM's ``serve`` flags, so that a ``vllm serve`` command line runs as ``swiftlm serve``.

Each flag either does here what it does in vLLM, or is accepted with the reason it changes
nothing (its help says which). ``no_effect`` names the flags given whose asked-for effect does not
happen on this device; ``swiftlm serve`` logs them in one line at start. A flag whose request is
what swiftlm does anyway (``--enforce-eager`` on a CPU: no graphs there; ``--tensor-parallel-size
1``; ``--enable-reasoning``: reasoning is separated by default; ``--enable-auto-tool-choice``: tool
calls are parsed by default; ``--enable-batch-api``: the Batch API is on by default) is not listed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from swiftlm.config import REASONING_PARSERS, TOOL_CALL_PARSERS, ConfigError


def parse_bool(text: str) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``, ``on``/``off``), as vLLM's boolean flags take."""
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean; use true or false")


def json_string_list(text: str) -> list[str]:
    """vLLM's CORS flags take a JSON list of strings, e.g. '["https://example.com"]'."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON: give a list such as '[\"*\"]'") from exc
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a JSON list of strings")
    return value


def add_vllm_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "vLLM compatibility",
        "vLLM's flag names, each with the effect it has here. The flags given whose effect does not "
        "happen on this device are listed in one log line at start.",
    )
    g.add_argument("--gpu-memory-utilization", type=float, metavar="F",
                   help="CUDA: the share of the device's memory for weights + KV cache; the KV pool gets what "
                        "the weights leave. No effect on a CPU: the pool keeps --kv-cache-memory's budget")
    g.add_argument("--max-queue-waiting-time", type=float, metavar="MS",
                   help="--max-queue-wait in milliseconds (both given: they must agree)")
    g.add_argument("--enable-reasoning", action="store_true",
                   help="accepted: the reasoning is always separated from the answer unless --reasoning-parser none")
    g.add_argument("--reasoning-parser", choices=REASONING_PARSERS, default="qwen3",
                   help="qwen3 and deepseek_r1 (the same for Qwen3) move <think>...</think> to the reasoning "
                        "fields; none leaves it inline in content (default: qwen3)")
    g.add_argument("--num-scheduler-steps", type=int, metavar="N",
                   help="accepted, no effect: one engine step per schedule (scheduling costs little next to a step)")
    g.add_argument("--disable-log-stats", nargs="?", const=True, type=parse_bool, metavar="BOOL",
                   help="accepted: swiftlm logs no periodic stats line (read /metrics), so true is what happens "
                        "and false has no effect")
    g.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, metavar="N",
                   help="1 only: one device per replica; scale out with replicas")
    g.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1, metavar="N", help="1 only, as above")
    g.add_argument("--swap-space", type=float, metavar="GiB",
                   help="accepted, no effect: preempted requests are recomputed, never swapped to CPU memory")
    g.add_argument("--enforce-eager", action="store_true",
                   help="CUDA: capture no decode graphs, run every step eagerly (on a CPU: no effect)")
    g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="overlapped steps: the host schedules and builds step N+1 while the device runs step N "
                        "(default: off: on a CPU the model and the host share the cores and it measured "
                        "slower; on CUDA it is not measured yet)")
    g.add_argument("--enable-batch-api", action="store_true",
                   help="accepted: the Batch API (/v1/files, /v1/batches) is on unless --disable-batch-api")
    g.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default="fcfs",
                   help="fcfs serves requests in arrival order; priority by the request's priority field "
                        "(lower first), then arrival (default: fcfs). Batch API lines always wait for "
                        "interactive requests")
    g.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="accepted: tool_choice auto is always served; tool calls are parsed into message.tool_calls "
                        "unless --tool-call-parser none")
    g.add_argument("--tool-call-parser", choices=TOOL_CALL_PARSERS,
                   help="hermes (Qwen3's <tool_call> format) parses the calls into message.tool_calls when the "
                        "request offers tools; none leaves them as text in content (default: hermes)")
    g.add_argument("--chat-template", metavar="FILE",
                   help="a Jinja chat template (a file, or the template itself) replacing the model's own")
    for flag, what in (("--allowed-origins", "origins"), ("--allowed-methods", "methods"),
                       ("--allowed-headers", "headers")):
        g.add_argument(flag, type=json_string_list, default=["*"], metavar="JSON",
                       help=f'CORS: the {what} browsers may use, a JSON list (default: ["*"], any)')
    g.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials (default: off)")
    g.add_argument("--speculative-config", metavar="JSON",
                   help='speculative decoding by prompt lookup, e.g. \'{"method": "ngram", "num_speculative_tokens": 3, '
                        '"prompt_lookup_max": 4, "prompt_lookup_min": 2}\': guessed tokens from earlier in the text, '
                        "checked in one step (same output; faster where the answer repeats the prompt). "
                        "ngram only (no draft models). Default: off")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="accepted: swiftlm runs no code from a checkpoint, so there is nothing to trust")


def check_vllm_flags(args: argparse.Namespace) -> None:
    """Raise ConfigError for values swiftlm cannot honour."""
    for flag, size in (("--tensor-parallel-size", args.tensor_parallel_size),
                       ("--pipeline-parallel-size", args.pipeline_parallel_size)):
        if size != 1:
            raise ConfigError(
                f"{flag} {size}: swiftlm runs one replica per device and does not split a model across "
                f"devices; use {flag} 1 and scale out with more replicas behind a router"
            )
    if args.num_scheduler_steps is not None and args.num_scheduler_steps < 1:
        raise ConfigError(f"--num-scheduler-steps must be >= 1, got {args.num_scheduler_steps}")
    if args.enable_auto_tool_choice and args.tool_call_parser == "none":
        raise ConfigError("--enable-auto-tool-choice parses tool calls and --tool-call-parser none turns parsing off; "
                          "give one of them")
    if args.enable_batch_api and args.disable_batch_api:
        raise ConfigError("--enable-batch-api and --disable-batch-api contradict each other; give one of them")
    if args.enable_reasoning and args.reasoning_parser == "none":
        raise ConfigError("--enable-reasoning separates the reasoning and --reasoning-parser none keeps it inline; "
                          "give one of them")


def max_queue_wait(args: argparse.Namespace) -> float | None:
    """Seconds, from ``--max-queue-wait`` (seconds) or ``--max-queue-waiting-time`` (vLLM's, milliseconds)."""
    seconds, ms = args.max_queue_wait, args.max_queue_waiting_time
    for flag, value in (("--max-queue-wait", seconds), ("--max-queue-waiting-time", ms)):
        if value is not None and value <= 0:
            raise ConfigError(f"{flag} must be positive, got {value}")
    if ms is None:
        return seconds
    if seconds is not None and abs(seconds - ms / 1000) > 1e-9:
        raise ConfigError(
            f"--max-queue-wait {seconds} (seconds) and --max-queue-waiting-time {ms} (milliseconds) disagree; "
            "give one of them"
        )
    return ms / 1000


def read_chat_template(value: str | None) -> str | None:
    """The Jinja source ``--chat-template`` names: a file's text, or the value itself when it is a
    template (as vLLM accepts); checked to compile."""
    if value is None:
        return None
    from swiftlm.text.chat_template import ChatTemplate, ChatTemplateError  # not needed for --help

    path = Path(value).expanduser()
    if path.is_file():
        text = path.read_text(encoding="utf-8")
    elif "{{" in value or "{%" in value:
        text = value
    else:
        raise ConfigError(f"--chat-template {value}: no such file (give a Jinja file, or the template itself)")
    try:
        ChatTemplate(text)
    except ChatTemplateError as exc:
        raise ConfigError(f"--chat-template {value}: {exc}") from exc
    return text


def no_effect(args: argparse.Namespace) -> list[str]:
    """The flags given whose asked-for effect does not happen on this device, each with the reason."""
    cuda = args.device.startswith("cuda")
    notes = []
    if args.gpu_memory_utilization is not None:
        if not cuda:
            notes.append("--gpu-memory-utilization (on a CPU the KV pool keeps its own budget, --kv-cache-memory)")
        elif args.kv_cache_memory is not None:
            notes.append("--gpu-memory-utilization (--kv-cache-memory sets the KV pool)")
    if args.num_scheduler_steps is not None and args.num_scheduler_steps > 1:
        notes.append("--num-scheduler-steps (one engine step per schedule)")
    if args.disable_log_stats is False:
        notes.append("--disable-log-stats false (no periodic stats line is logged; read /metrics)")
    if args.swap_space:
        notes.append("--swap-space (preempted requests are recomputed, not swapped)")
    return notes
