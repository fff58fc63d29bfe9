"""The swiftlm modules one chat request passes through, from the route handler to the scheduler's add.

    .venv/bin/python benchmarks/server/request_path.py            # this checkout
    PYTHONPATH=/path/to/other/src .venv/bin/python benchmarks/server/request_path.py   # another tree

Serves a tiny random checkpoint in this process (the real app, on 127.0.0.1), sends one chat
request with the openai SDK, and traces every Python call (``sys.setprofile`` and
``threading.setprofile``, so the engine loop's thread too) from the moment
``create_chat_completion`` is entered until ``Scheduler.add_request`` is. Prints the swiftlm modules
whose functions ran in that window, their count, and the size of ``engine/engine.py``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 1024, "vocab_size": 151936,
         "tie_word_embeddings": True}


ROLES = {  # what each module on the road is for (prefixes; the first that matches)
    "swiftlm.server.routes": "route", "swiftlm.server.state": "route",
    "swiftlm.server.completions": "the API's field mapping", "swiftlm.server.protocol": "data types",
    "swiftlm.server.operations": "server policy (keys, limits)", "swiftlm.server.answer_cache": "server policy (answer cache)",
    "swiftlm.frontend.input_processor": "input processor", "swiftlm.frontend": "output processor (set up at submit)",
    "swiftlm.text.detokenizer": "output processor (set up at submit)", "swiftlm.text": "text services (template, tokens)",
    "swiftlm.core": "data types", "swiftlm.sampling": "data types",
    "swiftlm.engine.async_engine": "engine driver", "swiftlm.engine": "engine",
}


def role(module: str) -> str:
    return next((r for prefix, r in ROLES.items() if module == prefix or module.startswith(prefix + ".")), "other")


class PathTrace:
    """Swiftlm modules called between the route handler's start and the scheduler's add."""

    def __init__(self) -> None:
        self.armed = False  # off during the warm-up request
        self.active = False
        self.done = False
        self.modules: list[str] = []

    def __call__(self, frame, event: str, _arg) -> None:
        if event != "call" or self.done or not self.armed:
            return
        name = frame.f_globals.get("__name__", "")
        func = frame.f_code.co_name
        if not self.active:
            if func == "create_chat_completion" and name.startswith("swiftlm.server"):
                self.active = True
            else:
                return
        if name.startswith("swiftlm") and name not in self.modules:
            self.modules.append(name)
        if func == "add_request" and name == "swiftlm.engine.scheduler":
            self.done = True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import torch
    import uvicorn
    from make_random_model import write_tokenizer_files
    from openai import OpenAI

    import swiftlm
    from swiftlm.config import ServerConfig
    from swiftlm.engine.async_engine import AsyncEngine
    from swiftlm.engine.engine import Engine
    from swiftlm.llm import engine_config
    from swiftlm.model.random_checkpoint import write_random_checkpoint
    from swiftlm.server.app import create_app

    path = Path(tempfile.mkdtemp(prefix="swiftlm_path_")) / "tiny"
    write_random_checkpoint(path, SHAPE, seed=0, dtype=torch.float32, std=0.05)
    write_tokenizer_files(path)
    trace = PathTrace()
    threading.setprofile(trace)  # the threads started from here on (the engine loop's, the server's)
    engine = AsyncEngine(Engine(engine_config(str(path), "float32", "cpu")))
    app = create_app(engine, ServerConfig(), "tiny")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    threading.setprofile(None)
    port = server.servers[0].sockets[0].getsockname()[1]
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
    messages = [{"role": "user", "content": "Hello there"}]
    client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)  # warm-up: imports, caches
    trace.armed = True
    client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    trace.armed = False
    server.should_exit = True
    thread.join(timeout=10)
    engine.shutdown(drain_timeout_s=1)
    engine_py = Path(swiftlm.__file__).parent / "engine" / "engine.py"
    print(f"swiftlm from {Path(swiftlm.__file__).parent}")
    print(f"reached the scheduler's add: {trace.done}")
    for name in trace.modules:
        print(f"  {name}  ({role(name)})")
    roles: dict[str, int] = {}
    for name in trace.modules:
        roles[role(name)] = roles.get(role(name), 0) + 1
    print("by role: " + ", ".join(f"{r} {n}" for r, n in roles.items()))
    print(f"modules: {len(trace.modules)}; engine/engine.py: {len(engine_py.read_text().splitlines())} lines")
    return 0 if trace.done else 1


if __name__ == "__main__":
    sys.exit(main())
