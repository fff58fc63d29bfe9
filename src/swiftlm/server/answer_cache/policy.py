"""The exact-match response cache: a repeated deterministic request answered without compute.

Off by default (``--response-cache memory|sqlite:PATH``). What it keeps and when:

- Only deterministic requests: greedy (temperature 0, after the checkpoint's defaults apply) or
  with a fixed ``seed``. A sampled request without a seed is never looked up nor stored.
- Bypassed: ``"cache": false`` in the body, a ``Cache-Control: no-cache`` (or ``no-store``)
  header, and any request with a ``session_id`` (a hit would skip the turn the session records),
  or on the Responses API a turn continuing a stored chain (``routes.responses``).
- The key: a SHA-256 of the route, the served model name the response reports, the canonical
  request body (every field as validated, defaults filled in, keys sorted; without ``stream``,
  ``stream_options``, ``user``, ``request_id``, ``priority`` and the cache switches, which cannot
  change the answer), the model's identity (``swiftlm.server.model_identity``: weights files,
  quantisation, dtype, template, sampling defaults) together with the server settings that shape
  an answer (thinking defaults and rules, parsers), and the caller's API key scope: an entry is
  private to the key that made it.
- What is stored: the whole answer in the non-streamed format (``swiftlm.server.answer_cache.answers``
  assembles it from a streamed miss), so a streamed hit and a whole hit come from one entry.
- Limits: entries older than the TTL are not served; beyond ``max_entries`` entries or
  ``max_bytes`` bytes the least recently used go.
- Usage on a hit: ``prompt_tokens`` and ``completion_tokens`` are the answer's, as on the miss (the
  client receives those tokens); ``prompt_tokens_details.cached_tokens`` equals
  ``prompt_tokens``, and the extension field ``swiftlm`` says ``"cache": "hit"`` with
  ``"computed_tokens": 0`` (nothing was computed). The header ``x-swiftlm-cache`` is ``hit``,
  ``miss`` or ``bypass``.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from swiftlm.config import ServerConfig
from swiftlm.sampling import SamplingParams
from swiftlm.server.answer_cache.store import CacheStore, MemoryStore, SqliteStore

CACHE_HEADER = "x-swiftlm-cache"
# request fields that cannot change the answer, left out of the key
NOT_IN_KEY = frozenset({
    "stream", "stream_options", "user", "request_id", "priority", "cache", "use_cache", "session_id",
    "session_reset", "clean_up_tokenization_spaces",
})


@dataclass(frozen=True, slots=True)
class CacheStats:
    hits: int
    misses: int
    entries: int
    bytes: int


def is_deterministic(params: SamplingParams) -> bool:
    """Greedy, or sampled from a fixed seed: the same request gives the same answer."""
    return params.temperature == 0 or params.seed is not None


def bypasses_cache(body: Any, headers: Mapping[str, str]) -> bool:
    """The request asks not to be served from the cache, or belongs to a session."""
    if getattr(body, "cache", None) is False or getattr(body, "session_id", None) is not None:
        return True
    directives = {d.strip().lower() for d in headers.get("cache-control", "").split(",")}
    return bool(directives & {"no-cache", "no-store"})


class ResponseCache:
    """Whole answers (JSON objects) by request key. ``identity``: the model's and the server's
    (see the module docstring); ``clock``: wall-clock seconds."""

    def __init__(
        self, store: CacheStore, identity: str, ttl_s: float | None, max_entries: int, max_bytes: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.identity = identity
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def key(self, route: str, model: str, caller_scope: str, body: BaseModel) -> str:
        canonical = body.model_dump(mode="json", exclude=set(NOT_IN_KEY))
        canonical["model"] = model
        text = json.dumps(
            {"route": route, "identity": self.identity, "caller": caller_scope, "body": canonical},
            sort_keys=True, ensure_ascii=False, separators=(",", ":"),
        )
        return hashlib.sha256(text.encode()).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored answer, counted as a hit; None (a miss) when absent or expired."""
        now = self._clock()
        with self._lock:
            found = self.store.get(key, now)
            if found is not None and self.ttl_s is not None and now - found[1] > self.ttl_s:
                self.store.delete(key)
                found = None
            if found is None:
                self.misses += 1
                return None
            self.hits += 1
        return json.loads(found[0])

    def put(self, key: str, answer: dict[str, Any]) -> None:
        value = json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode()
        if len(value) > self.max_bytes:
            return  # would evict everything and still not fit
        with self._lock:
            self.store.put(key, value, self._clock())
            self.store.trim(self.max_entries, self.max_bytes)

    def stats(self) -> CacheStats:
        with self._lock:
            entries, size = self.store.usage()
            return CacheStats(self.hits, self.misses, entries, size)

    def close(self) -> None:
        self.store.close()


def open_response_cache(config: ServerConfig, identity: str) -> ResponseCache | None:
    """The cache ``config.response_cache`` names (None: off)."""
    if config.response_cache is None:
        return None
    if config.response_cache == "memory":
        store: CacheStore = MemoryStore()
    else:
        store = SqliteStore(config.response_cache.removeprefix("sqlite:"))
    return ResponseCache(
        store, identity, config.response_cache_ttl_s, config.response_cache_max_entries,
        config.response_cache_max_bytes,
    )


def server_identity(config: ServerConfig, rules: Any) -> dict[str, Any]:
    """The server settings that shape an answer, for the cache's identity."""
    return {
        "default_chat_template_kwargs": config.default_chat_template_kwargs,
        "default_thinking": config.default_thinking,
        "auto_thinking_budget": config.auto_thinking_budget,
        "thinking_rules": repr(rules),
        "reasoning_parser": config.reasoning_parser,
        "tool_call_parser": config.tool_call_parser,
    }


def cache_identity(model: str, server: dict[str, Any]) -> str:
    text = json.dumps({"model": model, "server": server}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()
