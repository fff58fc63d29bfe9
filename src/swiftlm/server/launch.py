"""``swiftlm serve``: load the model, start uvicorn, drain in-flight requests on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import signal
import threading
from collections.abc import Iterator, Sequence

import uvicorn

from swiftlm.config import EngineConfig, ServerConfig
from swiftlm.engine.async_engine import AsyncEngine
from swiftlm.engine.engine import Engine
from swiftlm.server.app import create_app
from swiftlm.server.operations.connections import uvicorn_config

logger = logging.getLogger("swiftlm.server")


class _Server(uvicorn.Server):
    """uvicorn, but SIGTERM/SIGINT end ``serve`` normally instead of being re-raised after the
    graceful shutdown, so the engine can drain and the process exits 0."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _effective_config(engine_config: EngineConfig, server_config: ServerConfig, quantization: str | None) -> str:
    server = dataclasses.asdict(server_config)
    if server.get("api_key"):
        server["api_key"] = "***"
    server["api_keys"] = [{**spec, "key": "***"} for spec in server.get("api_keys", [])]  # keys are never logged
    engine = dataclasses.asdict(engine_config)
    if engine.get("chat_template"):
        engine["chat_template"] = f"<{len(engine['chat_template'])} characters of Jinja>"
    return json.dumps({"engine": engine, "server": server, "quantization": quantization}, default=str)


def serve(
    engine_config: EngineConfig, server_config: ServerConfig, quantization: str | None = None,
    no_effect: Sequence[str] = (),
) -> None:
    """Serve until SIGTERM/SIGINT. The port opens at once; /health is 503 until the model loads.

    ``no_effect``: the flags given that change nothing on this device, with reasons (logged once)."""
    if quantization not in (None, "none"):
        engine_config = dataclasses.replace(engine_config, quantization=quantization)
    logging.basicConfig(level=server_config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logger.info("effective configuration: %s", _effective_config(engine_config, server_config, quantization))
    if no_effect:
        logger.warning("flags with no effect on %s: %s", engine_config.device, "; ".join(no_effect))
    app = create_app(None, server_config, engine_config.model)
    state = app.state.swiftlm
    load_error: list[BaseException] = []

    def load() -> None:
        try:
            engine = Engine(engine_config)
            state.attach(AsyncEngine(engine))
            logger.info("model loaded in %.2fs; serving %s", engine.load_seconds, ", ".join(state.model_names))
        except BaseException as exc:  # reported, and the server exits
            load_error.append(exc)
            logger.exception("could not load the model")
            server.should_exit = True

    server = _Server(uvicorn_config(app, server_config))
    loader = threading.Thread(target=load, name="swiftlm-load", daemon=True)
    loader.start()
    try:
        asyncio.run(server.serve())
    finally:
        # uvicorn has stopped accepting connections and waited for open ones; finish the engine
        state.shutting_down = True
        if state.engine is not None:
            state.engine.shutdown(drain_timeout_s=30.0)
    if load_error:
        raise SystemExit(f"error: could not load the model: {load_error[0]}")
