"""CORS as vLLM sets it up: any origin by default; ``--allowed-origins`` (a JSON list) narrows it."""

from __future__ import annotations

import shlex

import httpx
import pytest

from swiftlm.cli import build_configs, build_parser
from swiftlm.config import ServerConfig

PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}


def _preflight(server, origin: str) -> httpx.Response:
    return httpx.options(server.v1 + "/chat/completions", headers={"Origin": origin, **PREFLIGHT}, timeout=10)


def test_any_origin_by_default(start_server, tiny_tied_dir) -> None:
    s = start_server(tiny_tied_dir)
    r = _preflight(s, "http://app.example")
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
    r = httpx.get(s.v1 + "/models", headers={"Origin": "http://app.example"}, timeout=10)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"


def test_allowed_origins_narrow_it(start_server, tiny_tied_dir) -> None:
    s = start_server(tiny_tied_dir, ServerConfig(allowed_origins=("https://ok.example",)))
    ok = _preflight(s, "https://ok.example")
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://ok.example"
    bad = _preflight(s, "https://evil.example")
    assert bad.status_code == 400 and "access-control-allow-origin" not in bad.headers


def test_the_flags_take_json_lists() -> None:
    line = """m --allowed-origins '["https://a.example", "https://b.example"]' --allowed-methods '["POST"]'"""
    server = build_configs(build_parser().parse_args(["serve", *shlex.split(line)]))[1]
    assert server.allowed_origins == ("https://a.example", "https://b.example")
    assert server.allowed_methods == ("POST",) and server.allowed_headers == ("*",)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "m", "--allowed-origins", "https://a.example"])  # not JSON
