"""create_app: the FastAPI application, with all state made here (no module globals)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

from swiftlm.config import ServerConfig
from swiftlm.engine.async_engine import AsyncEngine
from swiftlm.server.auth import check_api_key
from swiftlm.server.errors import OpenAIError, install_error_handlers
from swiftlm.server.routes import chat, completions, misc
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

    @app.middleware("http")
    async def authenticate(request: Request, call_next) -> Response:
        try:
            check_api_key(request, config.api_key)
        except OpenAIError as exc:
            return exc.response()
        return await call_next(request)

    app.include_router(misc.router)
    app.include_router(chat.router)
    app.include_router(completions.router)
    return app
