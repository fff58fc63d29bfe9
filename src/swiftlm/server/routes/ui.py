"""The web playground: ``/`` and its static files under ``/ui/`` (shipped in the package, no
build step). The page talks to the server through the public API only."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

from swiftlm.server.errors import not_found

UI_FILES = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}

router = APIRouter(include_in_schema=False)


def _file(name: str) -> Response:
    if name not in UI_FILES:  # a fixed set: no path from the request reaches the file system
        raise not_found(f"the playground has no file '{name}'")
    body = (files("swiftlm.server") / "ui" / name).read_bytes()
    return Response(body, media_type=f"{UI_FILES[name]}; charset=utf-8", headers={"Cache-Control": "no-cache"})


@router.get("/")
async def index() -> Response:
    return _file("index.html")


@router.get("/ui/{name}")
async def static_file(name: str) -> Response:
    return _file(name)
