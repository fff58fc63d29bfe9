"""Server fixtures: the real app on uvicorn (127.0.0.1) over tiny checkpoints.

The scripted checkpoint (tests/conftest.py) answers "<think>Hmm, okay</think>\\n\\nHello there!".
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn

from swiftlm.config import ServerConfig
from swiftlm.engine.async_engine import AsyncEngine
from swiftlm.engine.engine import Engine
from swiftlm.llm import engine_config
from swiftlm.server.app import create_app
from swiftlm.server.operations.connections import uvicorn_config
from tests.conftest import ANSWER, REASONING, TINY_TIED, make_tiny_model  # noqa: F401 (ANSWER, REASONING: re-exported)


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: all bound at once before any is released, so the OS cannot hand the
    same one out twice (servers started together bind only later)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class RunningServer:
    base_url: str
    engine: AsyncEngine
    model: str

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def run_in_engine(self, fn):
        """Run fn(engine) on the engine thread between steps."""
        return asyncio.run(self.engine.run_in_engine(fn))

    def assert_no_leaks(self) -> None:
        deadline = time.monotonic() + 10
        while True:
            report = self.run_in_engine(lambda engine: engine.kv_report())
            assert report.error is None, report.error
            free, expected, live = report.blocks_free, report.blocks_usable - report.blocks_in_sessions, report.live_requests
            if (free == expected and live == 0) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert live == 0, f"{live} requests still in the engine"
        assert free == expected, f"{expected - free} KV blocks leaked"


@pytest.fixture(scope="session")
def tiny_long_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny tied model with a 64k context: a request of 60000 tokens holds a slot for the whole
    test (about a minute of decoding, which a loaded machine's stalls cannot outlast). Serve it with
    ``max_model_len=65536`` and few ``max_num_seqs`` (the KV pool is sized for full batches)."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny_long"), {**TINY_TIED, "max_position_embeddings": 65536}, seed=1)


def run_uvicorn(app, config: ServerConfig, port: int) -> tuple[uvicorn.Server, threading.Thread]:
    """``app`` on uvicorn (``swiftlm serve``'s configuration) at 127.0.0.1:``port``, in a daemon
    thread, started; stop it with ``server.should_exit = True`` and a join."""
    server = uvicorn.Server(uvicorn_config(app, config, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    return server, thread


@pytest.fixture(scope="module")
def start_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """start_server(model_dir, server_config=None, **engine_kwargs) -> RunningServer. Each
    server keeps its Batch API jobs in a fresh directory unless the config names one."""
    servers: list[tuple[uvicorn.Server, threading.Thread, AsyncEngine]] = []

    def start(model_dir: Path, server_config: ServerConfig | None = None, **engine_kwargs) -> RunningServer:
        engine_kwargs.setdefault("dtype", "float32")
        dtype = engine_kwargs.pop("dtype")
        engine = AsyncEngine(Engine(engine_config(str(model_dir), dtype, "cpu", **engine_kwargs)))
        port = free_port()
        config = server_config or ServerConfig()
        if config.enable_batch_api and config.batch_storage_dir is None:
            config = dataclasses.replace(config, batch_storage_dir=str(tmp_path_factory.mktemp("batches")))
        app = create_app(engine, config, "swiftlm-test")
        server, thread = run_uvicorn(app, config, port)
        servers.append((server, thread, engine))
        return RunningServer(f"http://127.0.0.1:{port}", engine, "swiftlm-test")

    yield start
    for server, thread, engine in servers:
        server.should_exit = True
        thread.join(timeout=10)
        engine.shutdown(drain_timeout_s=1)
