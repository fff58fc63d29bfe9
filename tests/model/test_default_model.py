"""The default model (the installed SmolLM2 GGUF) and --override-generation-config."""

from __future__ import annotations

import json

import pytest

from swiftlm.cli import apply_default_model, build_configs, build_parser
from swiftlm.model import default_model
from swiftlm.text.tokenizer import Tokenizer

pytestmark = pytest.mark.skipif(default_model.default_model_path() is None, reason=default_model.INSTALL)


def _serve_args(argv: list[str]):
    """What ``swiftlm serve ARGV`` resolves to before it starts (main's default-model step)."""
    args = build_parser().parse_args(["serve", *argv])
    apply_default_model(args)
    return build_configs(args)


def test_serve_without_a_model_serves_the_installed_gguf_by_its_name() -> None:
    engine, server = _serve_args([])
    assert engine.model.endswith(default_model.FILE)
    assert server.served_model_names == (default_model.SERVED_NAME,)
    assert engine.generation_overrides == default_model.GENERATION_DEFAULTS
    engine, _ = _serve_args(["--override-generation-config", '{"temperature": 0.7}'])
    assert engine.generation_overrides == {"temperature": 0.7}  # the user's own values win


def test_main_sets_the_default_model(monkeypatch) -> None:
    from swiftlm import cli

    seen = {}
    monkeypatch.setattr(cli, "_run_serve", lambda args: seen.update(vars(args)) or 0)
    assert cli.main(["serve", "--port", "0"]) == 0
    assert seen["model"].endswith(default_model.FILE) and seen["served_model_name"] == [default_model.SERVED_NAME]
    assert json.loads(seen["override_generation_config"]) == default_model.GENERATION_DEFAULTS


def test_generation_overrides_apply_over_the_checkpoint(tiny_tied_dir) -> None:
    qwen3_tokenizer = Tokenizer.from_dir(tiny_tied_dir)
    base = qwen3_tokenizer.generation_defaults
    assert base["temperature"] == 0.6  # the checkpoint's generation_config.json
    changed = qwen3_tokenizer.with_generation_defaults({"temperature": 0.2, "top_p": 0.9})
    assert changed.generation_defaults == {**base, "temperature": 0.2, "top_p": 0.9}
    assert qwen3_tokenizer.generation_defaults == base  # the original is untouched
    with pytest.raises(ValueError, match="not sampling defaults"):
        qwen3_tokenizer.with_generation_defaults({"max_tokens": 5})
