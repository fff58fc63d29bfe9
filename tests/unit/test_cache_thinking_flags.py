"""The serve flags of the response cache and automatic thinking, as ServerConfig fields and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swiftlm.cli import build_configs, build_parser
from swiftlm.config import ConfigError, ServerConfig
from swiftlm.text.thinking_rules import ThinkingRulesError


def server_config(*flags: str) -> ServerConfig:
    return build_configs(build_parser().parse_args(["serve", "/models/m", *flags]))[1]


def test_flags_map_onto_the_server_config(tmp_path: Path) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"on_words": ["why"]}), encoding="utf-8")
    config = server_config(
        "--response-cache", f"sqlite:{tmp_path / 'c.sqlite'}", "--response-cache-ttl", "60",
        "--response-cache-max-entries", "5", "--response-cache-max-bytes", "1MiB", "--default-thinking", "auto",
        "--thinking-rules", str(rules), "--auto-thinking-budget", "128",
    )
    assert config == ServerConfig(
        response_cache=f"sqlite:{tmp_path / 'c.sqlite'}", response_cache_ttl_s=60.0, response_cache_max_entries=5,
        response_cache_max_bytes=2**20, default_thinking="auto", thinking_rules_path=str(rules),
        auto_thinking_budget=128,
    )
    defaults = server_config()
    assert defaults.response_cache is None and defaults.default_thinking is None


@pytest.mark.parametrize(("flags", "error", "message"), [
    (["--response-cache", "redis"], ConfigError, "memory or sqlite:PATH"),
    (["--response-cache", "memory", "--response-cache-ttl", "0"], ConfigError, "response_cache_ttl_s must be > 0"),
    (["--response-cache-max-entries", "0"], ConfigError, "must be >= 1"),
    (["--auto-thinking-budget", "-1"], ConfigError, "auto_thinking_budget must be >= 0"),
    (["--thinking-rules", "/nonexistent/rules.json"], ThinkingRulesError, "cannot read it"),
])
def test_bad_values_are_refused_before_the_server_starts(flags: list[str], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        server_config(*flags)
