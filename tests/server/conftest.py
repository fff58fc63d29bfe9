"""Server fixtures: the real app on uvicorn (127.0.0.1) over tiny checkpoints.

The *scripted* checkpoint answers deterministically: attention and MLP outputs are zeroed, so
the next token depends only on the current one, and the lm_head maps a chain of tokens

    "\\n" -> <think> -> "Hmm" -> "," -> " okay" -> </think> -> "\\n\\n" -> "Hello" -> " there" -> "!" -> <|im_end|>

A thinking prompt (ends in "assistant\\n") yields "<think>Hmm, okay</think>\\n\\nHello there!";
a non-thinking prompt (ends in "</think>\\n\\n") yields "Hello there!".
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import uvicorn
from safetensors.torch import load_file, save_file

from swiftlm.config import ServerConfig
from swiftlm.engine.async_engine import AsyncEngine
from swiftlm.engine.engine import Engine
from swiftlm.llm import engine_config
from swiftlm.server.app import create_app
from tests.conftest import TINY_UNTIED, make_tiny_model

SCRIPT = [198, 151667, 80022, 11, 16910, 151668, 271, 9707, 1052, 0, 151645]
REASONING = "Hmm, okay"
ANSWER = "Hello there!"


def make_scripted_model(dst: Path) -> Path:
    make_tiny_model(dst, TINY_UNTIED, seed=5)
    tensors = load_file(str(dst / "model.safetensors"))
    embed = torch.randn(tensors["model.embed_tokens.weight"].shape, generator=torch.Generator().manual_seed(3))
    tensors["model.embed_tokens.weight"] = embed
    head = torch.zeros_like(tensors["lm_head.weight"])
    for cur, nxt in zip(SCRIPT, SCRIPT[1:], strict=False):
        head[nxt] += 10.0 * embed[cur] / embed[cur].norm()
    tensors["lm_head.weight"] = head
    for name in tensors:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensors[name] = torch.zeros_like(tensors[name])
        elif name.endswith("norm.weight"):
            tensors[name] = torch.ones_like(tensors[name])
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="session")
def scripted_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_scripted_model(tmp_path_factory.mktemp("scripted"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        def check(engine: Engine) -> tuple[int, int, int]:
            kv = engine.kv
            live = [r for p in engine._parents.values() for r in p.children]
            kv.check_integrity(live)
            pinned = {b for s in kv.sessions.all() for b in s.block_ids}
            return kv.pool.num_free_blocks, kv.pool.num_usable_blocks - len(pinned), len(live)

        deadline = time.monotonic() + 10
        while True:
            free, expected, live = self.run_in_engine(check)
            if (free == expected and live == 0) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert live == 0, f"{live} requests still in the engine"
        assert free == expected, f"{expected - free} KV blocks leaked"


@pytest.fixture(scope="module")
def start_server() -> Iterator:
    """start_server(model_dir, server_config=None, **engine_kwargs) -> RunningServer."""
    servers: list[tuple[uvicorn.Server, threading.Thread, AsyncEngine]] = []

    def start(model_dir: Path, server_config: ServerConfig | None = None, **engine_kwargs) -> RunningServer:
        engine_kwargs.setdefault("dtype", "float32")
        dtype = engine_kwargs.pop("dtype")
        engine = AsyncEngine(Engine(engine_config(str(model_dir), dtype, "cpu", **engine_kwargs)))
        port = free_port()
        app = create_app(engine, server_config or ServerConfig(), "swiftlm-test")
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while not server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        servers.append((server, thread, engine))
        return RunningServer(f"http://127.0.0.1:{port}", engine, "swiftlm-test")

    yield start
    for server, thread, engine in servers:
        server.should_exit = True
        thread.join(timeout=10)
        engine.shutdown(drain_timeout_s=1)
