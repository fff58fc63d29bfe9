"""One request to an OpenAI-compatible server, timed: the `RequestRecord` it yields and the
`RequestSender` that sends it (streaming SSE or one JSON body) through httpx.

Errors of the target are recorded, never raised: a refused or timed-out connection is
"connect"; no complete response within the time limit is "timeout"; HTTP 429 / other 4xx / 5xx
are "http_429" / "http_4xx" / "http_5xx"; anything that breaks the protocol (bad JSON, an error
event mid-stream, a stream without `data: [DONE]`, a dropped connection) is "protocol".
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from swiftlm.bench.workloads import BenchRequest

if TYPE_CHECKING:
    from swiftlm.bench.load_config import LoadConfig

ERROR_KINDS = ("connect", "http_429", "http_4xx", "http_5xx", "timeout", "protocol")


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request. Times are seconds; `start` counts from the start of the run.
    `latency` is also set for failures (time until the failure); `ttft` and `itl` need streaming.
    `itl` holds the gaps between streamed chunks that carry content or reasoning (one token per
    chunk on vLLM-like servers)."""

    index: int
    kind: str
    conversation_id: int = 0
    turn: int = 0
    ok: bool = False
    error: str | None = None  # one of ERROR_KINDS when not ok
    error_detail: str | None = None
    status: int | None = None
    start: float = 0.0
    ttft: float | None = None
    latency: float | None = None
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    usage_reported: bool = False  # False: completion_tokens counts streamed chunks instead
    output_chars: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def api_root(base_url: str) -> str:
    """`http://host:port` from `http://host:port`, `.../` or `.../v1`."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def request_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def build_body(
    request: BenchRequest,
    model: str | None,
    stream: bool,
    extra_body: Mapping[str, Any],
    history: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """The JSON body of one request: workload sampling first, `extra_body` overriding it."""
    body: dict[str, Any] = {"max_tokens": request.max_tokens, "stream": stream, **request.sampling}
    if model is not None:
        body["model"] = model
    if request.kind == "chat":
        body["messages"] = [*history, *({"role": r, "content": c} for r, c in request.messages)]
    else:
        body["prompt"] = request.prompt
    if request.session_id is not None:
        body["session_id"] = request.session_id
    if stream:
        body["stream_options"] = {"include_usage": True}
    body.update(extra_body)
    return body


async def resolve_model(base_url: str, api_key: str | None = None, timeout_s: float = 10.0) -> str | None:
    """The first model id the server lists at /v1/models, or None when that fails."""
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            resp = await client.get(f"{api_root(base_url)}/v1/models", headers=request_headers(api_key))
            resp.raise_for_status()
            data = resp.json().get("data") or []
            return str(data[0]["id"]) if data else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError, IndexError):
        return None


class _ProtocolError(Exception):
    """The response does not follow the OpenAI protocol."""


# What a broken response raises while it is read and parsed (a dropped connection, bad JSON,
# missing fields): recorded as "protocol" errors.
_MALFORMED = (httpx.HTTPError, _ProtocolError, ValueError, KeyError, TypeError, IndexError, AttributeError)


def _status_error(status: int) -> str:
    if status == 429:
        return "http_429"
    return "http_4xx" if status < 500 else "http_5xx"


def _apply_usage(record: RequestRecord, usage: Mapping[str, Any]) -> None:
    record.usage_reported = True
    record.prompt_tokens = usage.get("prompt_tokens")
    record.completion_tokens = usage.get("completion_tokens")
    record.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    record.reasoning_tokens = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")


def _choice_text(choice: Mapping[str, Any], key: str) -> tuple[str, str]:
    """(content, reasoning) of a choice; key is "delta" or "message" for chat, "" for completions."""
    if not key:
        return choice.get("text") or "", ""
    part = choice.get(key) or {}
    return part.get("content") or "", part.get("reasoning_content") or part.get("reasoning") or ""


class RequestSender:
    """Sends requests of one run through one httpx.AsyncClient, timing each."""

    def __init__(self, config: LoadConfig, model: str | None, t0: float) -> None:
        self.config = config
        self.model = model
        self.t0 = t0
        self.root = api_root(config.base_url)
        self.headers = request_headers(config.api_key)
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
            limits=httpx.Limits(
                max_connections=config.concurrency, max_keepalive_connections=config.concurrency
            ),
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    async def send(
        self, request: BenchRequest, index: int, history: Sequence[Mapping[str, str]] = ()
    ) -> tuple[RequestRecord, str]:
        """Send one request; returns its record and the reply's content (for the next turn)."""
        cfg = self.config
        path = "/v1/chat/completions" if request.kind == "chat" else "/v1/completions"
        body = build_body(request, self.model, cfg.stream, cfg.extra_body, history)
        record = RequestRecord(index, request.kind, request.conversation_id, request.turn)
        start = time.perf_counter()
        record.start = start - self.t0
        reply: list[str] = []
        try:
            async with asyncio.timeout(cfg.timeout_s):
                if cfg.stream:
                    await self._stream(f"{self.root}{path}", body, request.kind, record, start, reply)
                else:
                    await self._once(f"{self.root}{path}", body, request.kind, record, reply)
            record.ok = record.error is None
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            record.error, record.error_detail = "connect", f"{type(exc).__name__}: {exc}"
        except (TimeoutError, httpx.TimeoutException) as exc:
            record.error, record.error_detail = (
                "timeout",
                f"no complete response within {cfg.timeout_s:g} s ({type(exc).__name__})",
            )
        except _MALFORMED as exc:
            record.error, record.error_detail = "protocol", f"{type(exc).__name__}: {exc}"[:300]
        record.latency = time.perf_counter() - start
        return record, "".join(reply)

    async def _error_from(self, resp: httpx.Response, record: RequestRecord) -> None:
        await resp.aread()
        record.error = _status_error(resp.status_code)
        retry = resp.headers.get("retry-after")
        record.error_detail = (
            f"HTTP {resp.status_code}"
            + (f" (Retry-After: {retry})" if retry else "")
            + f": {resp.text[:200]}"
        )

    async def _once(
        self, url: str, body: dict[str, Any], kind: str, record: RequestRecord, reply: list[str]
    ) -> None:
        resp = await self.client.post(url, json=body, headers=self.headers)
        record.status = resp.status_code
        if resp.status_code != 200:
            await self._error_from(resp, record)
            return
        data = resp.json()
        content, reasoning = _choice_text(data["choices"][0], "message" if kind == "chat" else "")
        reply.append(content)
        record.output_chars = len(content) + len(reasoning)
        if data.get("usage"):
            _apply_usage(record, data["usage"])

    async def _stream(
        self, url: str, body: dict[str, Any], kind: str, record: RequestRecord, start: float, reply: list[str]
    ) -> None:
        key = "delta" if kind == "chat" else ""
        last: float | None = None
        chunks = 0
        done = False
        async with self.client.stream("POST", url, json=body, headers=self.headers) as resp:
            record.status = resp.status_code
            if resp.status_code != 200:
                await self._error_from(resp, record)
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, SSE comments, event names
                payload = line[len("data:") :].strip()
                if payload == "[DONE]":
                    done = True
                    break
                data = json.loads(payload)
                if data.get("error"):
                    raise _ProtocolError(f"error event in stream: {json.dumps(data['error'])[:200]}")
                for choice in data.get("choices") or []:
                    content, reasoning = _choice_text(choice, key)
                    if not (content or reasoning):
                        continue
                    now = time.perf_counter()
                    if last is None:
                        record.ttft = now - start
                    else:
                        record.itl.append(now - last)
                    last = now
                    chunks += 1
                    reply.append(content)
                    record.output_chars += len(content) + len(reasoning)
                if data.get("usage"):
                    _apply_usage(record, data["usage"])
        if not done:
            raise _ProtocolError("stream ended without data: [DONE]")
        if not record.usage_reported:
            record.completion_tokens = chunks
