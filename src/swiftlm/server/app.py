"""create_app: the FastAPI application, with all state made here (no module globals)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response

from swiftlm.config import ServerConfig
from swiftlm.engine.async_engine import AsyncEngine
from swiftlm.server.batch.api import BatchApi
from swiftlm.server.batch.calls import InProcessCall
from swiftlm.server.errors import OpenAIError, install_error_handlers
from swiftlm.server.openapi import install_openapi
from swiftlm.server.operations.auth import CALLER, set_caller
from swiftlm.server.operations.body_limit import BodyLimit
from swiftlm.server.responses.store import ResponseStore
from swiftlm.server.routes import batches, chat, completions, debug, files, misc, responses, ui
from swiftlm.server.state import ServerState


def create_app(engine: AsyncEngine | None, config: ServerConfig, model_name: str) -> FastAPI:
    """The app for ``engine``; pass None to start before the model is loaded and ``attach`` it
    later through ``app.state.swiftlm`` (``/health`` answers 503 until then)."""
    app = FastAPI(title="swiftlm", docs_url=None, redoc_url=None)
    state = ServerState(config=config, model_name=model_name)
    if engine is not None:
        state.attach(engine)
    app.state.swiftlm = state
    install_error_handlers(app)
    install_openapi(app)

    @app.middleware("http")
    async def authenticate(request: Request, call_next) -> Response:
        if CALLER not in request.scope:  # a Batch API line carries its job's owner
            try:
                set_caller(request.scope, state.keys.caller(request))
            except OpenAIError as exc:
                return exc.response()
        return await call_next(request)

    app.add_middleware(BodyLimit, limit=config.max_request_bytes)
    app.add_middleware(
        CORSMiddleware, allow_origins=list(config.allowed_origins), allow_methods=list(config.allowed_methods),
        allow_headers=list(config.allowed_headers), allow_credentials=config.allow_credentials,
    )
    app.include_router(misc.router)
    app.include_router(chat.router)
    app.include_router(completions.router)
    retention = None if config.response_retention_hours is None else config.response_retention_hours * 3600.0
    state.responses = ResponseStore(state.storage_dir, retention)  # beside the Batch API's jobs
    app.include_router(responses.router)
    app.router.on_shutdown.append(state.responses.close)
    app.router.on_shutdown.append(state.close_response_cache)
    if config.enable_debug_endpoints:
        app.include_router(debug.router)
    if config.enable_ui:
        app.include_router(ui.router)
    if config.enable_batch_api:
        state.batch_api = BatchApi.open(
            config.batch_storage_dir, config.port, InProcessCall(app), config.max_batch_file_bytes,
            config.batch_retention_hours, config.batch_max_concurrent_lines, shared=config.batch_storage_shared,
        )
        state.metrics.watch_batches(lambda: state.batch_api.runner.counts)
        app.include_router(files.router)
        app.include_router(batches.router)
        app.router.on_startup.append(state.batch_api.start)  # resumes the jobs a crash left unfinished
        app.router.on_shutdown.append(state.batch_api.close)
    return app
