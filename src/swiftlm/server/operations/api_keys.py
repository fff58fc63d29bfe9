"""``--api-key-file``: the keys a server accepts, one per line, each with an optional name and
its own limits::

    # comments and blank lines are skipped
    sk-alice-1234  name=alice rpm=60 tpm=20000
    sk-bob-5678    name=bob
    sk-ci-0000

Errors name the line (never the key): a key given twice, an unknown field, a limit that is not a
positive integer.
"""

from __future__ import annotations

from pathlib import Path

from swiftlm.config import ApiKeySpec, ConfigError

_FIELDS = ("name", "rpm", "tpm")


def parse_api_keys(text: str, source: str = "the API key file") -> tuple[ApiKeySpec, ...]:
    specs: list[ApiKeySpec] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        key, fields = words[0], {}
        for word in words[1:]:
            name, sep, value = word.partition("=")
            if not sep or name not in _FIELDS or not value:
                raise ConfigError(f"{source} line {lineno}: expected name=, rpm= or tpm=, got {word!r}")
            fields[name] = value
        limits = {}
        for limit in ("rpm", "tpm"):
            if limit in fields:
                if not fields[limit].isdigit() or int(fields[limit]) < 1:
                    raise ConfigError(f"{source} line {lineno}: {limit} must be a positive integer")
                limits[limit] = int(fields[limit])
        if key in seen:
            raise ConfigError(f"{source} line {lineno}: this key was already given on an earlier line")
        seen.add(key)
        specs.append(ApiKeySpec(key, name=fields.get("name"), **limits))
    if not specs:
        raise ConfigError(f"{source} holds no keys")
    return tuple(specs)


def read_api_key_file(path: str) -> tuple[ApiKeySpec, ...]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read --api-key-file {path}: {exc.strerror}") from exc
    return parse_api_keys(text, f"--api-key-file {path}")
