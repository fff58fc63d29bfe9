"""``swiftlm batch -i requests.jsonl -o results.jsonl --model M``: a Batch API input file run
without a server (vLLM's ``run-batch``), with a progress bar.

Each line runs through the same endpoints the server has (in process), so a line's result is what
``swiftlm serve`` would give for it. The job is kept in a state directory (``--state-dir``,
default ``<output>.state``) exactly as the server keeps its jobs: run the same command again
after an interruption and it resumes, running only the lines without a result (each result is
recorded once). The output file holds every line in input order, in OpenAI's batch output format
(``response`` for the lines that ran, ``error`` for those that could not).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from swiftlm.config import DTYPE_CHOICES


def add_batch_parser(sub: Any) -> None:
    p = sub.add_parser("batch", help="run a Batch API input file (JSONL) offline, as vLLM's run-batch")
    p.add_argument("-i", "--input-file", required=True, help="the requests, one JSON object per line")
    p.add_argument("-o", "--output-file", required=True, help="where the results go (JSONL)")
    p.add_argument("--model", required=True, help="local model directory or Hugging Face hub id")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto", help="weight dtype (default: auto)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: cpu)")
    p.add_argument("--quantization", choices=("none", "int8", "int4"), default="none")
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--state-dir", help="where the job's progress is kept (default: <output-file>.state)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_batch_command)


def run_batch_command(args: argparse.Namespace) -> int:
    from swiftlm.engine.async_engine import AsyncEngine
    from swiftlm.engine.engine import Engine
    from swiftlm.llm import engine_config

    data = Path(args.input_file).read_bytes()
    config = engine_config(
        args.model, args.dtype, args.device, quantization=args.quantization, max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
    )
    engine = AsyncEngine(Engine(config))
    from swiftlm.batch.objects import error_line, output_line

    try:
        state_dir = Path(args.state_dir or args.output_file + ".state")
        batch_id, results = asyncio.run(run_offline(engine, args.model, data, state_dir, progress=not args.no_progress))
    finally:
        engine.shutdown(drain_timeout_s=1)
    out = Path(args.output_file)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join((output_line if r.succeeded else error_line)(batch_id, r) + "\n" for r in results))
    tmp.replace(out)
    failed = sum(not r.succeeded for r in results)
    print(f"{len(results)} results in {out} ({failed} failed)", file=sys.stderr)
    return 0


def endpoint_of(data: bytes) -> str:
    """The job's endpoint: the url of the first line that names one of the two, else chat."""
    from swiftlm.server.batch.api import BATCH_ENDPOINTS

    for raw in data.decode("utf-8", errors="replace").splitlines():
        try:
            url = json.loads(raw).get("url")
        except (json.JSONDecodeError, AttributeError):
            continue
        if url in BATCH_ENDPOINTS:
            return url
    return BATCH_ENDPOINTS[0]


async def run_offline(
    engine: Any, model: str, data: bytes, state_dir: Path, progress: bool = True
) -> tuple[str, list[Any]]:
    """Run the input file ``data`` through ``engine``'s endpoints, resuming a job of the same file
    in ``state_dir``; returns the job's id and its ``LineResult``s in input order."""
    from tqdm import tqdm

    from swiftlm.batch.objects import TERMINAL
    from swiftlm.batch.runner import BatchLimits, BatchRunner
    from swiftlm.batch.store import BatchStore
    from swiftlm.config import ServerConfig
    from swiftlm.server.app import create_app
    from swiftlm.server.batch.calls import InProcessCall

    app = create_app(engine, ServerConfig(enable_batch_api=False), model)
    store = BatchStore(state_dir)
    owner = "offline:" + hashlib.sha256(data).hexdigest()[:16]  # one job per input file's content
    runner = BatchRunner(store, InProcessCall(app), BatchLimits(retention_s=None))
    await runner.start()  # resumes this file's job if an earlier run was interrupted
    jobs, _ = store.list_batches(owner, None, 1)
    if jobs:
        batch = jobs[0]
    else:
        file = store.create_file(owner, "batch", "input.jsonl", data)
        batch = store.create_batch(owner, file.id, endpoint_of(data), "24h", None, expires_in_s=10 * 365 * 24 * 3600)
        runner.launch(batch)
    bar = tqdm(desc="batch", unit="line", disable=not progress, file=sys.stderr)
    try:
        while True:
            current = store.get_batch(owner, batch.id)
            assert current is not None
            if bar.total != current.total:
                bar.total = current.total
            bar.n = current.completed + current.failed
            bar.refresh()
            if current.status in TERMINAL:
                break
            await asyncio.sleep(0.2)
    finally:
        bar.close()
        await runner.close()
    if current.status == "failed":
        raise SystemExit(f"the batch failed: {current.errors}")
    return batch.id, store.results(batch.id)
