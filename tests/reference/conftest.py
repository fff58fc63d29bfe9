"""Fixtures for the articles' code: real ``swiftlm serve`` processes and a Hugging Face hub cache.

The articles name the model ``Qwen/Qwen3-0.6B``. No weights can be downloaded here, so
``hub_cache`` lays out a Hugging Face hub cache (``models--Qwen--Qwen3-0.6B/snapshots/<rev>/``,
``refs/main``) holding the scripted checkpoint of tests/conftest.py under that id, with the real
model's context length; servers and ``LLM`` resolve the id from it with ``HF_HUB_OFFLINE=1``.

The scripted checkpoint answers a thinking prompt with ``<think>Hmm, okay</think>\\n\\nHello there!``
and a non-thinking prompt with ``Hello there!``, so the token counts below follow from ``SCRIPT``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import SCRIPT
from tests.server.conftest import free_port

HUB_ID = "Qwen/Qwen3-0.6B"
SERVED_NAMES = ("Qwen/Qwen3-0.6B", "Qwen-0.6B")
# tokens the scripted checkpoint generates: after "assistant\n" (thinking) or after "</think>\n\n"
THINKING_TOKENS = len(SCRIPT) - 1
ANSWER_TOKENS = len(SCRIPT) - SCRIPT.index(271) - 1
START_TIMEOUT_S = 90.0


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory: pytest.TempPathFactory, scripted_model_dir: Path) -> Path:
    """A hub cache directory holding the scripted checkpoint as ``Qwen/Qwen3-0.6B``."""
    cache = tmp_path_factory.mktemp("hf_hub")
    commit = "c1899de289a04d12100db370d81485cdf75e47ca"
    repo = cache / ("models--" + HUB_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    shutil.copytree(scripted_model_dir, snapshot)
    config = json.loads((snapshot / "config.json").read_text())
    config["max_position_embeddings"] = 40960  # Qwen3-0.6B's, so the articles' --max-model-len 8192 fits
    (snapshot / "config.json").write_text(json.dumps(config))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return cache


def offline_env(cache: Path) -> dict[str, str]:
    return {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}


@dataclass
class ServeProcess:
    """One ``python -m swiftlm serve ...`` child process, its log in a file."""

    argv: list[str]
    port: int
    log_path: Path
    proc: subprocess.Popen = field(repr=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> int:
        """Poll GET /health until 200; the last status code seen (0: never answered). Only once this
        process's own log says it bound the port: another test's server may have taken the port
        between ``free_port()`` and the bind, and would answer /health for it (this process then logs
        "address already in use" and exits)."""
        deadline = time.monotonic() + timeout_s
        bound = re.compile(rf"Uvicorn running on http://\S+:{self.port}\b")  # any --host
        code = 0
        while time.monotonic() < deadline and self.proc.poll() is None:
            if bound.search(self.log_path.read_text(errors="replace")):
                try:
                    code = httpx.get(self.base_url + "/health", timeout=2).status_code
                except httpx.HTTPError:
                    code = 0
                if code == 200:
                    return code
            time.sleep(0.1)
        return code

    def lost_port(self) -> bool:
        """Whether the process could not bind its port because something else held it."""
        return "address already in use" in self.log_path.read_text(errors="replace")

    def generation_tokens(self) -> float:
        """The server's ``swiftlm:generation_tokens`` counter, summed over its labels."""
        text = httpx.get(self.base_url + "/metrics", timeout=10).text
        lines = re.findall(r"^swiftlm:generation_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.M)
        return sum(float(v) for v in lines)

    def generated_since(self, before: float, expected: int, timeout_s: float = 5.0) -> int:
        """Tokens generated since the counter read ``before``, waiting up to ``timeout_s`` for
        ``expected`` of them (the counter may be bumped just after the reply is sent)."""
        deadline = time.monotonic() + timeout_s
        while True:
            delta = self.generation_tokens() - before
            if delta >= expected or time.monotonic() > deadline:
                time.sleep(0.05)  # a counter that overshoots shows here too
                return int(self.generation_tokens() - before)
            time.sleep(0.02)

    def terminate(self) -> None:
        """SIGTERM: uvicorn stops accepting, the engine drains, the process exits."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self) -> None:
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def spawn_serve(args: list[str], port: int, log_dir: Path, env: dict[str, str] | None = None) -> ServeProcess:
    """Start ``swiftlm serve`` with these arguments (the caller puts the port in them)."""
    log_path = log_dir / f"serve-{port}.log"
    if args[:1] == ["serve"] and "--batch-storage-dir" not in args:  # Batch API jobs: not in the user's cache
        args = [*args, "--batch-storage-dir", str(log_dir / f"batches-{port}")]
    argv = [sys.executable, "-m", "swiftlm", *args]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )  # fmt: skip
    return ServeProcess(argv, port, log_path, proc)


class ServerPool:
    """Starts ``swiftlm serve`` children and stops them all at the end of the fixture's scope."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[ServeProcess] = []

    def __call__(self, args: list[str], port: int, env: dict[str, str] | None = None) -> ServeProcess:
        server = spawn_serve(args, port, self.log_dir, env)
        self.started.append(server)
        return server

    def stop_all(self) -> None:
        for server in self.started:  # all drain at once
            server.terminate()
        for server in self.started:
            server.wait_stopped()


@pytest.fixture(scope="module")
def serve_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    """serve_factory(args, port, env=None) -> ServeProcess, not yet healthy; all stopped at module end."""
    pool = ServerPool(tmp_path_factory.mktemp("serve_logs"))
    yield pool
    pool.stop_all()


@pytest.fixture(scope="session")
def _session_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    pool = ServerPool(tmp_path_factory.mktemp("serve_logs"))
    yield pool
    pool.stop_all()


def _start_reference(pool: ServerPool, model_dir: Path, *extra: str) -> ServeProcess:
    """A healthy server on a free port; on another port when the one picked was taken before the bind."""
    for _ in range(3):
        port = free_port()
        server = pool(["serve", str(model_dir), "--port", str(port), "--served-model-name", *SERVED_NAMES, *extra], port)
        if server.wait_healthy() == 200:
            return server
        if not server.lost_port():
            break
    raise AssertionError(server.log())


@pytest.fixture(scope="session")
def reference_server(_session_servers: ServerPool, scripted_model_dir: Path) -> ServeProcess:
    """``swiftlm serve MODEL --served-model-name Qwen/Qwen3-0.6B Qwen-0.6B`` on the scripted checkpoint
    (session scope: the three articles' modules share it; each uses its own session ids)."""
    return _start_reference(_session_servers, scripted_model_dir)


@pytest.fixture(scope="session")
def inline_think_server(_session_servers: ServerPool, scripted_model_dir: Path) -> ServeProcess:
    """The same with ``--reasoning-parser none``: ``<think>...</think>`` stays in ``content``."""
    return _start_reference(_session_servers, scripted_model_dir, "--reasoning-parser", "none")
