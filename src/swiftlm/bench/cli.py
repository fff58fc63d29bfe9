"""`swiftlm bench serve` and `swiftlm bench ab` (argparse). The top-level CLI calls
`add_bench_parser(subparsers)`; each subcommand sets `func(args) -> exit code`.
`python -m swiftlm.bench.cli serve ...` runs them without the top-level CLI.

Exit codes: 0 done (for `ab`: every --fail-if check passed), 1 a --fail-if check failed,
2 bad arguments, 3 a `swiftlm serve` child did not start.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from swiftlm.bench.workloads import PRESETS, WORKLOAD_NAMES


def _add_common(p: argparse.ArgumentParser) -> None:
    w = p.add_argument_group("workload")
    w.add_argument("--workload", choices=WORKLOAD_NAMES, default="qa", help="what to send (default: qa)")
    size = w.add_mutually_exclusive_group()
    size.add_argument(
        "--num-requests", type=int, help="requests per run (default: 64 for serve, 32 per round for ab)"
    )
    size.add_argument(
        "--duration", type=float, metavar="S", help="send for S seconds instead of a request count"
    )
    w.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    w.add_argument("--preset", choices=sorted(PRESETS), help="replace the workload's sampling preset")
    w.add_argument("--max-tokens", type=int, help="replace the workload's max_tokens")
    w.add_argument("--input-len", type=int, default=256, help="random: prompt tokens (default: 256)")
    w.add_argument("--output-len", type=int, default=128, help="random: output tokens (default: 128)")
    w.add_argument(
        "--range-ratio", type=float, default=0.0, help="random: lengths vary by +-ratio (default: 0)"
    )
    w.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="random: send ignore_eos so outputs have the set length (default: on)",
    )
    w.add_argument("--turns", type=int, default=4, help="chat: turns per conversation (default: 4)")
    w.add_argument(
        "--prefix-len", type=int, default=1000, help="shared-prefix: system prompt tokens (default: 1000)"
    )
    w.add_argument("--zh-ratio", type=float, default=0.2, help="share of Chinese texts (default: 0.2)")
    w.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="tokenizer.json(.gz) or a model directory, to size texts in real tokens "
        "(default: the model directory when --model or the serve args name one; else ~4 chars/token)",
    )
    r = p.add_argument_group("requests")
    r.add_argument("--model", help="model name to send (default: the first one GET /v1/models lists)")
    r.add_argument(
        "--stream",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="stream responses; TTFT and inter-token gaps need it (default: on)",
    )
    r.add_argument(
        "--extra-body",
        metavar="JSON",
        default="{}",
        help="fields merged into every request body, e.g. '{\"enable_thinking\": false}'",
    )
    r.add_argument(
        "--api-key",
        default=os.environ.get("SWIFTLM_API_KEY") or os.environ.get("OPENAI_API_KEY"),
        help="bearer token (default: $SWIFTLM_API_KEY or $OPENAI_API_KEY)",
    )
    r.add_argument(
        "--timeout", type=float, default=300.0, metavar="S", help="per-request time limit (default: 300)"
    )
    r.add_argument(
        "--warmup", type=int, default=0, metavar="N", help="unrecorded requests before each run (default: 0)"
    )
    o = p.add_argument_group("output")
    o.add_argument(
        "--output-dir", type=Path, help="where reports go (default: bench_results/<kind>-<workload>-<time>)"
    )
    o.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `bench` with its `serve` and `ab` subcommands to the top-level CLI's subparsers."""
    bench = subparsers.add_parser(
        "bench",
        help="measure an OpenAI-compatible server, or compare two",
        description="Benchmarks. Every run is seeded and writes JSON, Markdown and plots.",
    )
    sub = bench.add_subparsers(dest="bench_command", required=True, metavar="{serve,ab,engine,hf,peers}")

    serve = sub.add_parser("serve", help="load-test one server at one or more concurrency levels")
    serve.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000 (with or without /v1)")
    serve.add_argument("--concurrency", default="1", help="comma-separated levels, e.g. 1,4,16 (default: 1)")
    serve.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    _add_common(serve)
    serve.set_defaults(func=handle_serve)

    ab = sub.add_parser("ab", help="compare two configurations in interleaved rounds")
    ab.add_argument(
        "--a",
        required=True,
        metavar="URL|SERVE_ARGS",
        help='a base URL, or `swiftlm serve` args: "MODEL --flag v"',
    )
    ab.add_argument("--b", required=True, metavar="URL|SERVE_ARGS", help="the other side, same forms")
    for side in ("a", "b"):
        ab.add_argument(f"--{side}-extra-body", metavar="JSON",
                        help=f"fields merged over --extra-body for side {side.upper()} only")
        ab.add_argument(f"--{side}-stream", choices=("on", "off"),
                        help=f"streaming for side {side.upper()} only (default: --stream/--no-stream)")
    ab.add_argument("--concurrency", type=int, default=4, help="requests in flight (default: 4)")
    ab.add_argument("--rounds", type=int, default=2, help="A, B pairs (default: 2)")
    ab.add_argument(
        "--fail-if",
        action="append",
        default=[],
        metavar="EXPR",
        help="exit 1 when B vs A crosses it, e.g. 'p95_latency>+5%%' or 'success_rate<-1%%' (repeatable)",
    )
    ab.add_argument(
        "--fail-on",
        choices=("point", "ci"),
        default="point",
        help="judge --fail-if on the point estimate, or only when the whole 95%% CI crosses (default: point)",
    )
    ab.add_argument(
        "--bootstrap", type=int, default=2000, metavar="N", help="bootstrap resamples (default: 2000)"
    )
    ab.add_argument(
        "--restart-per-round", action="store_true", help="start and stop served sides around each round"
    )
    ab.add_argument(
        "--startup-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="wait this long for a started server's /health (default: 600)",
    )
    _add_common(ab)
    ab.set_defaults(func=handle_ab)

    engine = sub.add_parser("engine", help="in-process prefill/decode speed by batch size and context")
    engine.add_argument("--model", required=True, help="checkpoint directory or hub id")
    engine.add_argument("--dtype", default="auto")
    engine.add_argument("--quantization", default="none", choices=("none", "int8", "int4"))
    engine.add_argument("--batch-sizes", default="1,4,16", help="comma-separated (default: 1,4,16)")
    engine.add_argument("--contexts", default="32,512,2048", help="prompt lengths (default: 32,512,2048)")
    engine.add_argument("--decode-tokens", type=int, default=32, help="tokens decoded per request (default: 32)")
    engine.add_argument("--repeats", type=int, default=3, help="median of this many runs (default: 3)")
    engine.add_argument("--output", default=None, help="write the results as JSON here")
    engine.set_defaults(func=handle_engine)

    hf = sub.add_parser(
        "hf",
        help="the serve workload through Hugging Face transformers in-process (peer baseline)",
        description="Static batches of up to CONCURRENCY requests, one generate call each; --model is the "
        "checkpoint directory. --stream, --api-key and --timeout do not apply. See bench/hf_baseline.py.",
    )
    hf.add_argument("--concurrency", default="1", help="comma-separated levels, e.g. 1,4,16 (default: 1)")
    hf.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float16", "float32"))
    hf.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    hf.add_argument(
        "--arrival",
        choices=("closed", "at-once"),
        default="closed",
        help="clocks start when the batch starts, like bench serve's clients (closed), or all at t=0",
    )
    hf.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    _add_common(hf)
    hf.set_defaults(func=handle_hf)

    peers = sub.add_parser("peers", help="one side-by-side table from several results.json files")
    peers.add_argument("--results", nargs="+", required=True, metavar="JSON", help="results.json files")
    peers.add_argument("--labels", nargs="+", metavar="NAME", help="one per file (default: folder names)")
    peers.add_argument("--title", default="Peer comparison", help="the report's heading")
    peers.add_argument("--output", metavar="MD", help="also write the table here")
    peers.set_defaults(func=handle_peers)
    return bench


def handle_serve(args: argparse.Namespace) -> int:
    from swiftlm.bench.commands import run_guarded, serve_command

    return run_guarded(serve_command, args)


def handle_ab(args: argparse.Namespace) -> int:
    from swiftlm.bench.commands import ab_command, run_guarded

    return run_guarded(ab_command, args)


def handle_hf(args: argparse.Namespace) -> int:
    from swiftlm.bench.commands import run_guarded
    from swiftlm.bench.hf_baseline import hf_command

    return run_guarded(hf_command, args)


def handle_peers(args: argparse.Namespace) -> int:
    from swiftlm.bench.commands import run_guarded
    from swiftlm.bench.peers import peers_command

    return run_guarded(peers_command, args)


def handle_engine(args: argparse.Namespace) -> int:
    from pathlib import Path

    from swiftlm.bench.engine_bench import render_table, run_engine_bench, write_json
    from swiftlm.llm import LLM

    batches = [int(b) for b in args.batch_sizes.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    longest = max(contexts) + args.decode_tokens + 2
    llm = LLM(
        args.model, dtype=args.dtype, quantization=args.quantization, max_model_len=max(longest, 4096),
        max_num_seqs=max(batches), max_num_batched_tokens=max(512, max(batches)),
    )
    points = run_engine_bench(llm.engine, batches, contexts, args.decode_tokens, args.repeats)
    print(render_table(points))
    if args.output:
        meta = {"model": args.model, "dtype": llm.engine.dtype, "quantization": args.quantization, "repeats": args.repeats}
        write_json(points, Path(args.output), meta)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m swiftlm.bench.cli serve|ab ...`: the bench commands without the top-level CLI."""
    parser = argparse.ArgumentParser(prog="swiftlm")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *(argv if argv is not None else sys.argv[1:])])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
