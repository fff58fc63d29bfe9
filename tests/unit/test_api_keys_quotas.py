"""--api-key-file parsing and the per-key sliding-window rate limits (a fake clock)."""

from __future__ import annotations

import pytest

from swiftlm.config import ApiKeySpec, ConfigError, ServerConfig
from swiftlm.server.errors import OpenAIError
from swiftlm.server.operations.api_keys import parse_api_keys, read_api_key_file
from swiftlm.server.operations.auth import Caller, background_caller
from swiftlm.server.operations.quotas import RateLimits


def test_key_file_lines_names_limits_and_comments(tmp_path) -> None:
    text = "# team keys\n\nsk-a  name=alice rpm=60 tpm=20000\nsk-b name=bob   # no limits of its own\nsk-c tpm=5\n"
    specs = parse_api_keys(text)
    assert [(s.key, s.name, s.rpm, s.tpm) for s in specs] == [
        ("sk-a", "alice", 60, 20000), ("sk-b", "bob", None, None), ("sk-c", None, None, 5)]
    path = tmp_path / "keys"
    path.write_text(text)
    assert read_api_key_file(str(path)) == specs
    assert "sk-a" not in repr(specs[0])  # a key never shows in a repr (logs, tracebacks)


@pytest.mark.parametrize("text, words", [
    ("sk-a rpm=0", "line 1: rpm must be a positive integer"),
    ("sk-a\nsk-a", "line 2: this key was already given"),
    ("sk-a colour=red", "line 1: expected name="),
    ("sk-a tpm=many", "tpm must be a positive integer"),
    ("# nothing\n", "holds no keys"),
])
def test_key_file_errors_name_the_line_not_the_key(text, words) -> None:
    with pytest.raises(ConfigError, match=words) as info:
        parse_api_keys(text)
    assert "sk-a" not in str(info.value)


def test_unreadable_key_file_and_bad_limits(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read --api-key-file"):
        read_api_key_file(str(tmp_path / "missing"))
    with pytest.raises(ConfigError):
        ApiKeySpec("has space")
    with pytest.raises(ConfigError, match="default_rpm"):
        ServerConfig(default_rpm=0)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _retry_after(exc: OpenAIError) -> int:
    return int(exc.headers["Retry-After"])


def test_requests_per_minute_slide_and_are_per_caller() -> None:
    clock = Clock()
    limits = RateLimits(clock)
    alice, bob = Caller("a", "alice", rpm=2), Caller("b", "bob", rpm=2)
    limits.admit(alice, 10)
    clock.t += 20
    limits.admit(alice, 10)
    with pytest.raises(OpenAIError) as info:
        limits.admit(alice, 10)
    assert info.value.status == 429 and "alice" in info.value.message and "RPM" in info.value.message
    assert _retry_after(info.value) == 40  # the first request leaves the window 60 s after it came
    limits.admit(bob, 10)  # another key is not affected
    clock.t += 40.5
    limits.admit(alice, 10)  # the first one has left the window
    assert limits.used(alice) == (2, 0)  # no tpm: tokens are not counted


def test_tokens_per_minute_count_prompt_and_generated_tokens() -> None:
    clock = Clock()
    limits = RateLimits(clock)
    carol = Caller("c", "carol", tpm=100)
    limits.admit(carol, 30)
    limits.charge(carol, 50)  # generated while streaming
    assert limits.used(carol) == (1, 80)
    clock.t += 10
    with pytest.raises(OpenAIError) as info:
        limits.admit(carol, 30)  # 80 + 30 > 100
    assert "TPM" in info.value.message and _retry_after(info.value) == 50  # the first 30 leave at +60
    limits.admit(carol, 20)  # 80 + 20 fits
    with pytest.raises(OpenAIError, match="Request too large"):
        limits.admit(carol, 101)
    clock.t += 61
    assert limits.used(carol) == (0, 0)


def test_batch_lines_and_unlimited_callers_are_not_counted() -> None:
    limits = RateLimits(Clock())
    line = background_caller("a")
    for _ in range(100):
        limits.admit(line, 10_000)
        limits.admit(Caller("x", "free"), 10_000)
    assert limits.used(line) == (0, 0) and limits.used(Caller("x", "free")) == (0, 0)
