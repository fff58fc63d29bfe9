"""Schema-fuzz the API (the long form of tests/server/test_schema_fuzz.py).

    python scripts/fuzz_api.py                         # 500 cases per operation and mode, own server
    python scripts/fuzz_api.py --cases 2000 --time-limit 1800 --seed 7
    python scripts/fuzz_api.py --url http://127.0.0.1:8000 --api-key sk-...   # a running server

Without ``--url`` it starts a server in process on a tiny random checkpoint (the tests' shape, the
real Qwen3 tokenizer) with a small context window, so no case generates much. Prints the cases
run per operation (with the status codes seen) and every finding; exits 1 on any finding.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvicorn  # noqa: E402

from tests.helpers.schema_fuzz import fuzz  # noqa: E402


def start_server(max_model_len: int) -> tuple[str, uvicorn.Server]:
    from swiftlm.config import ServerConfig
    from swiftlm.engine.async_engine import AsyncEngine
    from swiftlm.engine.engine import Engine
    from swiftlm.llm import engine_config
    from swiftlm.server.app import create_app
    from tests.conftest import TINY_TIED, make_tiny_model
    from tests.server.conftest import free_port

    model_dir = make_tiny_model(Path(tempfile.mkdtemp(prefix="fuzz-model-")), TINY_TIED, seed=1)
    engine = AsyncEngine(Engine(engine_config(str(model_dir), "float32", "cpu", max_model_len=max_model_len)))
    config = ServerConfig(batch_storage_dir=tempfile.mkdtemp(prefix="fuzz-batches-"), enable_debug_endpoints=True, max_n=4)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine, config, "swiftlm-test"), host="127.0.0.1", port=port,
                                           log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Schema-fuzz every operation of the server's /openapi.json.")
    parser.add_argument("--cases", type=int, default=500, help="cases per operation and mode (default: 500)")
    parser.add_argument("--time-limit", type=float, default=900.0, help="seconds before no new operation starts")
    parser.add_argument("--deadline", type=float, default=10.0, help="seconds one answer may take (default: 10)")
    parser.add_argument("--seed", type=int, help="random seed (default: the same cases every run)")
    parser.add_argument("--url", help="fuzz this running server (loopback only) instead of starting one")
    parser.add_argument("--api-key", help="the server's API key, if it has one")
    parser.add_argument("--max-model-len", type=int, default=128, help="context window of the own server")
    args = parser.parse_args(argv)
    if args.cases < 1:
        parser.error(f"--cases must be at least 1, got {args.cases}")
    server = None
    url = args.url
    if url is None:
        url, server = start_server(args.max_model_len)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    t0 = time.monotonic()
    try:
        report = fuzz(url.rstrip("/"), args.cases, deadline_s=args.deadline, time_limit_s=args.time_limit,
                      seed=args.seed, headers=headers)
    finally:
        if server is not None:
            server.should_exit = True
    print(report.summary())
    print(f"{time.monotonic() - t0:.1f} s")
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
