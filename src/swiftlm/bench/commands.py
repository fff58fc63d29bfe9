"""What `swiftlm bench serve` and `swiftlm bench ab` do with their parsed arguments
(the parsers are in cli.py): build the workload, run it, write and print the reports."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from swiftlm.bench.ab import ABConfig, ServerStartError, parse_target, run_ab
from swiftlm.bench.client import LoadConfig, run_load_sync
from swiftlm.bench.compare import (
    DEFAULT_METRICS,
    compare,
    evaluate_checks,
    exit_code,
    parse_check,
    render_ab_markdown,
)
from swiftlm.bench.report import run_to_dict, summarize, write_json, write_markdown
from swiftlm.bench.text_gen import TokenCounter, load_token_counter
from swiftlm.bench.workloads import WorkloadOptions, build_workload
from swiftlm.config import ConfigError, parse_json_object


class UsageError(Exception):
    """Bad arguments found after parsing (exit code 2)."""


def _workload_options(args: argparse.Namespace) -> WorkloadOptions:
    try:
        return WorkloadOptions(
            zh_ratio=args.zh_ratio,
            input_len=args.input_len,
            output_len=args.output_len,
            range_ratio=args.range_ratio,
            ignore_eos=args.ignore_eos,
            turns=args.turns,
            prefix_len=args.prefix_len,
            preset=args.preset,
            max_tokens=args.max_tokens,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def _extra_body(text: str) -> dict[str, Any]:
    try:
        return parse_json_object(text, "--extra-body")
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc


def _token_counter(
    args: argparse.Namespace, model_dirs: Sequence[str | None]
) -> tuple[TokenCounter | None, str]:
    if args.tokenizer:
        try:
            return load_token_counter(args.tokenizer), args.tokenizer
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot load --tokenizer {args.tokenizer}: {exc}") from exc
    for d in model_dirs:
        if (
            d
            and Path(d).is_dir()
            and any((Path(d) / n).is_file() for n in ("tokenizer.json", "tokenizer.json.gz"))
        ):
            return load_token_counter(d), d
    return None, "estimate (~4 chars/token; pass --tokenizer for real tokens)"


def _output_dir(args: argparse.Namespace, kind: str) -> Path:
    out = (
        args.output_dir or Path("bench_results") / f"{kind}-{args.workload}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    out.mkdir(parents=True, exist_ok=True)
    return out


def run_guarded(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a command; a UsageError becomes a message on stderr and exit code 2."""
    try:
        return command(args)
    except UsageError as exc:
        print(f"swiftlm bench: error: {exc}", file=sys.stderr)
        return 2


def serve_command(args: argparse.Namespace) -> int:
    """Run the workload at each concurrency level; write results.json, results.md and plots."""
    try:
        levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    except ValueError as exc:
        raise UsageError(f"--concurrency takes comma-separated integers, got {args.concurrency!r}") from exc
    if not levels or min(levels) < 1:
        raise UsageError(f"--concurrency levels must be at least 1, got {args.concurrency!r}")
    options, extra = _workload_options(args), _extra_body(args.extra_body)
    count, counter_name = _token_counter(args, [args.model])
    num = args.num_requests if args.num_requests is not None else (None if args.duration else 64)
    nonce = f"{os.getpid()}-{int(time.time())}"
    runs = []
    for i, c in enumerate(levels):
        requests = build_workload(
            args.workload, num or 256, args.seed + i, count, options, f"bench-{nonce}-c{c}"
        )
        warmup = (
            build_workload(
                args.workload, args.warmup, args.seed + 100_000 + i, count, options, f"bench-{nonce}-w{c}"
            )
            if args.warmup
            else []
        )
        conversations = len({r.conversation_id for r in requests})
        if num and c > conversations:
            print(
                f"note: {num} requests make {conversations} conversation(s) of up to {options.turns} turns, "
                f"so at most {conversations} of concurrency {c} can be in flight",
                file=sys.stderr,
            )
        try:
            config = LoadConfig(
                args.base_url,
                model=args.model,
                concurrency=c,
                num_requests=num,
                duration_s=args.duration,
                stream=args.stream,
                timeout_s=args.timeout,
                api_key=args.api_key,
                extra_body=extra,
                show_progress=not args.no_progress,
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        run = run_load_sync(requests, config, warmup)
        runs.append(run)
        s = summarize(run.records, run.duration_s)
        print(
            f"concurrency {c}: {s['num_ok']}/{s['num_requests']} ok, {s['requests_per_s']:.2f} req/s, "
            f"{s['output_tokens_per_s']:.1f} output tok/s",
            file=sys.stderr,
        )
    meta = {
        "base_url": args.base_url,
        "model": runs[0].model,
        "workload": args.workload,
        "requests": f"{num} per level" if num else f"{args.duration:g} s per level",
        "stream": args.stream,
        "seed": args.seed,
        "options": dataclasses.asdict(options),
        "extra_body": extra,
        "token_counter": counter_name,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    write_reports(runs, meta, _output_dir(args, "serve"), plots=not args.no_plots)
    return 0


def write_reports(runs: list, meta: dict[str, Any], out: Path, plots: bool) -> None:
    """results.json, results.md and (unless ``plots`` is false) the PNG plots, into ``out``."""
    write_json(out / "results.json", runs, meta)
    md = write_markdown(out / "results.md", runs, meta)
    if plots:
        from swiftlm.bench.plots import write_plots

        write_plots(runs, out)
    print(md.read_text())
    print(f"reports in {out}/", file=sys.stderr)


def ab_command(args: argparse.Namespace) -> int:
    """Interleaved A/B rounds; write ab.json and ab.md; exit 1 when a --fail-if check fails."""
    try:
        checks = [parse_check(e) for e in args.fail_if]
        a, b = parse_target("A", args.a), parse_target("B", args.b)
        config = ABConfig(
            workload=args.workload,
            options=_workload_options(args),
            seed=args.seed,
            rounds=args.rounds,
            concurrency=args.concurrency,
            num_requests=None if args.duration else (args.num_requests or 32),
            duration_s=args.duration,
            stream=args.stream,
            model=args.model,
            api_key=args.api_key,
            extra_body=_extra_body(args.extra_body),
            side_extra_body={
                label: _extra_body(body)
                for label, body in (("A", args.a_extra_body), ("B", args.b_extra_body)) if body
            },
            side_stream={
                label: flag == "on" for label, flag in (("A", args.a_stream), ("B", args.b_stream)) if flag
            },
            timeout_s=args.timeout,
            warmup=args.warmup,
            restart_per_round=args.restart_per_round,
            startup_timeout_s=args.startup_timeout,
            show_progress=not args.no_progress,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    count, counter_name = _token_counter(
        args, [args.model, *(t.serve_args[0] for t in (a, b) if t.serve_args)]
    )
    out = _output_dir(args, "ab")
    try:
        rounds_a, rounds_b = run_ab(a, b, config, count, log_dir=out)
    except ServerStartError as exc:
        print(f"swiftlm bench ab: {exc}", file=sys.stderr)
        return 3
    metrics = list(DEFAULT_METRICS) + [c.metric for c in checks]
    comparisons = compare(rounds_a, rounds_b, metrics, n_boot=args.bootstrap, seed=args.seed)
    results = evaluate_checks(comparisons, checks, args.fail_on)
    meta = {
        "A": str(a),
        "B": str(b),
        "workload": args.workload,
        "concurrency": args.concurrency,
        "rounds": f"{args.rounds} x (A, B)",
        "requests": f"{config.num_requests} per round"
        if config.num_requests
        else f"{args.duration:g} s per round",
        "stream": {side: config.stream_for(side) for side in ("A", "B")},
        "extra_body": {side: config.extra_body_for(side) for side in ("A", "B")},
        "seed": args.seed,
        "token_counter": counter_name,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    md = render_ab_markdown(comparisons, results, meta)
    (out / "ab.md").write_text(md)
    payload = {
        "meta": meta,
        "A": [run_to_dict(r) for r in rounds_a],
        "B": [run_to_dict(r) for r in rounds_b],
        "comparisons": [dataclasses.asdict(c) for c in comparisons],
        "checks": [{"check": r.check.text, "passed": r.passed, "message": r.message} for r in results],
    }
    (out / "ab.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(md)
    print(f"reports in {out}/", file=sys.stderr)
    return exit_code(results)
