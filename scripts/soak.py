"""Soak a real ``swiftlm serve`` process: overload it for a while, then check that nothing leaked.

    python scripts/soak.py models/qwen3-0.6b-random --duration 600 -- --dtype bfloat16

Starts ``python -m swiftlm serve MODEL --enable-debug-endpoints ...`` (flags after ``--`` are
passed on), measures its capacity for the request mix below with a short closed loop, then
offers ``--load-factor`` times that rate open-loop (Poisson arrivals) for ``--duration`` seconds:
streamed and whole chat completions, /v1/completions, multi-turn sessions (``session_id``; turn
N+1 sends only the new message; each closed with DELETE /v1/sessions/{id}), chats sharing long
prefixes, and clients that go away on purpose (a stream cut after k chunks, a whole request
cancelled before its answer). The server's resident memory is sampled throughout.

Checks, each reported (exit status 1 if one fails):
- no 5xx; every response complete (a finish_reason; a stream ends with ``data: [DONE]``), cleanly
  refused (429 / 503 in OpenAI's error envelope) or cut by the client on purpose; no timeouts;
- resident memory after the warm-up grows by at most ``--max-rss-growth`` percent;
- /debug/kv after the drain: no error, no leaked block, no live request, no session's blocks;
- /metrics agrees with what the client saw (the relations are spelled out in ``metric_checks``);
- the server log holds no traceback, and SIGTERM stops the server with status 0.
A summary table is printed; ``--json PATH`` writes the whole summary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

KINDS = ("chat_stream", "chat_whole", "completion_stream", "completion_whole", "session", "prefix", "abort_stream",
         "abort_whole")
MIX = {"chat_stream": 0.20, "chat_whole": 0.15, "completion_stream": 0.08, "completion_whole": 0.07, "session": 0.20,
       "prefix": 0.15, "abort_stream": 0.08, "abort_whole": 0.07}
WORDS = ("river stone quiet lamp orbit cedar pixel harbor velvet signal maple ember tide copper lantern "
         "meadow falcon prism cobalt willow summit glacier thunder amber canyon").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- what the client saw --------------------------------------------------------------------------
@dataclass(slots=True)
class Outcome:
    """One request's fate. ``status``: complete, refused (429/503 in the envelope), aborted (by the
    client, on purpose), server_error (5xx), bad (anything else: incomplete stream, malformed
    body, other 4xx), timeout (no answer within the per-request timeout)."""

    kind: str
    status: str
    code: int | None = None
    detail: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    in_stream: bool = False  # a refusal or error sent as an SSE event after a 200
    answered: bool = True  # for aborts: whether the response (or its headers) arrived first
    finished_at: float = 0.0  # time.monotonic() when the client knew the outcome


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)
    sessions_opened: int = 0
    sessions_used: int = 0  # with at least one completed turn
    deletes: Counter = field(default_factory=Counter)  # DELETE status codes

    def count(self, status: str, kind: str | None = None) -> int:
        return sum(o.status == status and (kind is None or o.kind == kind) for o in self.outcomes)


def _envelope(body: Any) -> bool:
    err = body.get("error") if isinstance(body, dict) else None
    return isinstance(err, dict) and isinstance(err.get("message"), str) and "type" in err


def _refusal(kind: str, code: int, text: str) -> Outcome:
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if code in (429, 503):
        if _envelope(body):
            return Outcome(kind, "refused", code)
        return Outcome(kind, "bad", code, f"{code} without OpenAI's error envelope: {text[:200]}")
    return Outcome(kind, "server_error" if code >= 500 else "bad", code, text[:300])


def _whole(kind: str, r: httpx.Response) -> Outcome:
    if r.status_code != 200:
        return _refusal(kind, r.status_code, r.text)
    try:
        body = r.json()
        finish = body["choices"][0]["finish_reason"]
        usage = body["usage"]
    except (ValueError, KeyError, IndexError, TypeError):
        return Outcome(kind, "bad", 200, f"malformed answer: {r.text[:200]}")
    if not finish:
        return Outcome(kind, "bad", 200, f"no finish_reason: {r.text[:200]}")
    return Outcome(kind, "complete", 200, prompt_tokens=usage["prompt_tokens"], completion_tokens=usage["completion_tokens"])


@dataclass(frozen=True, slots=True)
class Cut:
    """Where a client goes away on purpose: after ``chunks`` chunks or ``seconds`` after the
    response's headers, whichever comes first (a model whose deltas are whitespace sends few)."""

    chunks: int
    seconds: float


async def _stream(client: httpx.AsyncClient, kind: str, path: str, body: dict, cut: Cut | None = None) -> Outcome:
    """A streamed request read to ``data: [DONE]``, or cut on purpose."""
    async with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            return _refusal(kind, r.status_code, (await r.aread()).decode(errors="replace"))
        if cut is None:
            return await _read_events(kind, r, None)
        try:
            async with asyncio.timeout(cut.seconds):
                return await _read_events(kind, r, cut.chunks)
        except TimeoutError:
            return Outcome(kind, "aborted", 200)  # leaving the block closes the connection


async def _read_events(kind: str, r: httpx.Response, cut_after: int | None) -> Outcome:
    finish, usage, done, chunks = None, None, False, 0
    async for line in r.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            break
        event = json.loads(data)
        if "error" in event:  # a failure after the 200: refusals travel like this too
            out = _refusal(kind, _error_status(event), data)
            out.in_stream = True
            return out
        usage = event.get("usage") or usage
        for choice in event.get("choices") or ():
            finish = choice.get("finish_reason") or finish
        chunks += 1
        if cut_after is not None and chunks >= cut_after and finish is None:
            return Outcome(kind, "aborted", 200)
    if not done or finish is None or usage is None:
        return Outcome(kind, "bad", 200, f"stream ended without [DONE], a finish_reason or usage ({done=}, {finish=})")
    return Outcome(kind, "complete", 200, prompt_tokens=usage["prompt_tokens"], completion_tokens=usage["completion_tokens"])


def _error_status(event: dict) -> int:
    kind = event["error"].get("type")
    return {"rate_limit_exceeded": 429, "service_unavailable": 503, "invalid_request_error": 400}.get(kind, 500)


# -- the request mix ------------------------------------------------------------------------------
@dataclass
class _Session:
    sid: str
    turns_left: int
    completed: int = 0


class Workload:
    """Makes the requests of the mix; one seeded random stream decides everything."""

    def __init__(self, client: httpx.AsyncClient, args: argparse.Namespace, tally: Tally) -> None:
        self.client, self.args, self.tally = client, args, tally
        self.rng = random.Random(args.seed)
        self.prefixes = [self._words(args.prefix_words) for _ in range(3)]
        self.idle_sessions: list[_Session] = []
        self.next_session = 0
        self.run_tag = f"soak{os.getpid()}"

    def _words(self, n: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(n))

    def _max_tokens(self) -> int:
        return self.rng.randint(self.args.min_tokens, self.args.max_tokens)

    def _chat(self, messages: list[dict], stream: bool, **extra: Any) -> dict:
        body = {"messages": messages, "max_tokens": self._max_tokens(), "stream": stream, **extra}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def pick(self, kinds: tuple[str, ...] = KINDS) -> str:
        return self.rng.choices(kinds, weights=[MIX[k] for k in kinds])[0]

    async def run(self, kind: str) -> Outcome:
        timeout = self.args.request_timeout
        try:
            async with asyncio.timeout(timeout):
                out = await getattr(self, "_" + kind)()
        except TimeoutError:
            out = Outcome(kind, "timeout", detail=f"no answer within {timeout}s")
        except (httpx.HTTPError, ValueError, KeyError) as exc:  # a dropped connection, a malformed event
            out = Outcome(kind, "bad", detail=f"{type(exc).__name__}: {exc}")
        out.finished_at = time.monotonic()
        self.tally.outcomes.append(out)
        return out

    async def _chat_stream(self) -> Outcome:
        body = self._chat([{"role": "user", "content": self._words(self.rng.randint(3, 30))}], True)
        return await _stream(self.client, "chat_stream", "/v1/chat/completions", body)

    async def _chat_whole(self) -> Outcome:
        body = self._chat([{"role": "user", "content": self._words(self.rng.randint(3, 30))}], False)
        return _whole("chat_whole", await self.client.post("/v1/chat/completions", json=body))

    def _completion(self, stream: bool) -> dict:
        body = {"prompt": self._words(self.rng.randint(3, 40)), "max_tokens": self._max_tokens(), "stream": stream}
        return {**body, "stream_options": {"include_usage": True}} if stream else body

    async def _completion_stream(self) -> Outcome:
        return await _stream(self.client, "completion_stream", "/v1/completions", self._completion(True))

    async def _completion_whole(self) -> Outcome:
        return _whole("completion_whole", await self.client.post("/v1/completions", json=self._completion(False)))

    async def _prefix(self) -> Outcome:
        system = {"role": "system", "content": self.rng.choice(self.prefixes)}
        question = {"role": "user", "content": self._words(self.rng.randint(3, 12))}
        stream = self.rng.random() < 0.5
        body = self._chat([system, question], stream)
        if stream:
            return await _stream(self.client, "prefix", "/v1/chat/completions", body)
        return _whole("prefix", await self.client.post("/v1/chat/completions", json=body))

    async def _abort_stream(self) -> Outcome:
        body = self._chat([{"role": "user", "content": self._words(self.rng.randint(3, 30))}], True,
                          max_tokens=self.args.max_tokens)
        cut = Cut(self.rng.randint(1, 4), self.rng.uniform(0.05, 1.0))
        return await _stream(self.client, "abort_stream", "/v1/chat/completions", body, cut)

    async def _abort_whole(self) -> Outcome:
        body = self._chat([{"role": "user", "content": self._words(self.rng.randint(3, 30))}], False,
                          max_tokens=self.args.max_tokens)
        delay = self.rng.uniform(0.05, 1.0)
        try:
            async with asyncio.timeout(delay):
                r = await self.client.post("/v1/chat/completions", json=body)
        except TimeoutError:
            return Outcome("abort_whole", "aborted", answered=False)
        return _whole("abort_whole", r)

    async def _session(self) -> Outcome:
        """One turn of a conversation: an idle open one, else a new one (2-5 turns)."""
        if self.idle_sessions:
            session = self.idle_sessions.pop(self.rng.randrange(len(self.idle_sessions)))
            messages = [{"role": "user", "content": self._words(self.rng.randint(3, 15))}]
        else:
            session = _Session(f"{self.run_tag}-{self.next_session}", self.rng.randint(2, 5))
            self.next_session += 1
            self.tally.sessions_opened += 1
            messages = [{"role": "system", "content": "You are terse."},
                        {"role": "user", "content": self._words(self.rng.randint(3, 15))}]
        body = self._chat(messages, self.rng.random() < 0.5, session_id=session.sid)
        try:
            if body["stream"]:
                out = await _stream(self.client, "session", "/v1/chat/completions", body)
            else:
                out = _whole("session", await self.client.post("/v1/chat/completions", json=body))
        except BaseException:
            await self.close_session(session)
            raise
        session.turns_left -= 1
        if out.status == "complete":
            session.completed += 1
            self.tally.sessions_used += session.completed == 1
        if session.turns_left > 0:
            self.idle_sessions.append(session)
        else:
            await self.close_session(session)
        return out

    async def close_session(self, session: _Session) -> None:
        """DELETE it: 200, or 404 when no turn of it reached the engine (or the cache let it go)."""
        try:
            r = await self.client.delete(f"/v1/sessions/{session.sid}")
        except httpx.HTTPError:
            self.tally.deletes[0] += 1  # no answer
            return
        self.tally.deletes[r.status_code] += 1

    async def close_idle_sessions(self) -> None:
        while self.idle_sessions:
            await self.close_session(self.idle_sessions.pop())


# -- phases ---------------------------------------------------------------------------------------
async def measure_capacity(work: Workload, clients: int, seconds: float) -> float:
    """Completed requests per second of ``clients`` closed-loop clients (the mix without aborts)."""
    kinds = tuple(k for k in KINDS if not k.startswith("abort"))
    end = time.monotonic() + seconds
    outcomes: list[Outcome] = []

    async def client() -> None:
        while time.monotonic() < end:
            outcomes.append(await work.run(work.pick(kinds)))

    start = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    return sum(o.status == "complete" for o in outcomes) / (time.monotonic() - start)


async def offer_load(work: Workload, rate: float, seconds: float) -> tuple[int, float, set[asyncio.Task]]:
    """Poisson arrivals at ``rate``/s for ``seconds``; (requests sent, elapsed, tasks still running)."""
    tasks: set[asyncio.Task] = set()
    start = time.monotonic()
    end = start + seconds
    sent = 0
    next_at = start
    while True:
        next_at += work.rng.expovariate(rate)
        if next_at >= end:
            break
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        task = asyncio.create_task(work.run(work.pick()))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        sent += 1
    return sent, time.monotonic() - start, tasks


class RssSampler:
    """A process's resident memory every ``interval`` seconds: (monotonic time, VmRSS MiB, MiB of
    it in huge-page buffers). The CPU backend maps its weights arena and KV pools as anonymous
    memory madvised for huge pages (VmFlags ``hg``); KV pages are faulted in as blocks are first
    used, so VmRSS grows until every block has been touched once: first use, not a leak. The
    check reads the rest (``outside``): the Python heap, malloc arenas, torch's other tensors."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, float, float]] = []

    def read(self) -> tuple[float, float] | None:
        """(VmRSS, huge-page buffers' RSS) in MiB, from /proc/PID/smaps; None once it is gone."""
        total = pools = rss = 0
        try:
            with open(f"/proc/{self.pid}/smaps") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss = int(line.split()[1])
                        total += rss
                    elif line.startswith("VmFlags:") and " hg" in line:
                        pools += rss
        except OSError:
            return None
        return total / 1024, pools / 1024

    def sample(self) -> None:
        read = self.read()
        if read is not None:
            self.samples.append((time.monotonic(), *read))

    async def run(self) -> None:
        while True:
            await asyncio.to_thread(self.sample)  # smaps of a big process takes milliseconds
            await asyncio.sleep(self.interval)

    def peak(self, start: float, end: float, outside: bool = True) -> float | None:
        """The largest sample in [start, end]: outside the huge-page buffers, or VmRSS."""
        values = [rss - pools if outside else rss for t, rss, pools in self.samples if start <= t <= end]
        return max(values) if values else None


# -- the server -----------------------------------------------------------------------------------
def start_server(args: argparse.Namespace, port: int, workdir: Path) -> tuple[subprocess.Popen, list[str], Path]:
    argv = [sys.executable, "-m", "swiftlm", "serve", args.model, "--enable-debug-endpoints", "--port", str(port),
            "--batch-storage-dir", str(workdir / "batches"), *args.serve_args]
    log_path = Path(args.server_log) if args.server_log else workdir / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc, argv, log_path


def wait_healthy(proc: subprocess.Popen, base_url: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base_url + "/health", timeout=2).status_code == 200:
                return True
        time.sleep(0.2)
    return False


def parse_metrics(text: str) -> dict[str, dict[str, float]]:
    """``{name: {labels: value}}`` for the swiftlm samples of a Prometheus text page."""
    found: dict[str, dict[str, float]] = {}
    for name, labels, value in re.findall(r"^(swiftlm:\w+?)(?:\{([^}]*)\})? (\S+)$", text, re.M):
        found.setdefault(name, {})[labels] = float(value)
    return found


def metric(found: dict[str, dict[str, float]], name: str, label: str | None = None) -> float:
    """A sample summed over its labels (or over those carrying ``label``, e.g. 'reason="queue_full"')."""
    return sum(v for labels, v in found.get(name, {}).items() if label is None or label in labels)


async def wait_kv_settled(client: httpx.AsyncClient, timeout_s: float = 15.0) -> dict:
    """/debug/kv once no request is live (aborts reach the engine a moment after the disconnect)."""
    deadline = time.monotonic() + timeout_s
    while True:
        report = (await client.get("/debug/kv")).json()
        if report.get("live_requests") == 0 or time.monotonic() > deadline:
            return report
        await asyncio.sleep(0.2)


# -- checks ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


def client_checks(t: Tally) -> list[Check]:
    statuses = Counter(o.status for o in t.outcomes)
    examples = {o.status: f"{o.kind} {o.code}: {o.detail}" for o in t.outcomes if o.status not in ("complete", "refused", "aborted")}
    bad_deletes = {code: n for code, n in t.deletes.items() if code not in (200, 404)}
    return [
        Check("no 5xx", statuses["server_error"] == 0, f"{statuses['server_error']} ({examples.get('server_error', '-')})"),
        Check("every response complete, refused or cut on purpose", statuses["bad"] == 0, f"{statuses['bad']} other ({examples.get('bad', '-')})"),
        Check("no request timed out", statuses["timeout"] == 0, f"{statuses['timeout']} timed out"),
        Check("DELETE /v1/sessions answered 200 or 404", not bad_deletes, f"codes {dict(t.deletes)}"),
    ]


def kv_checks(kv: dict) -> list[Check]:
    return [
        Check("/debug/kv error is null", kv.get("error") is None, str(kv.get("error"))),
        Check("/debug/kv leaked_blocks == 0", kv.get("leaked_blocks") == 0, str(kv.get("leaked_blocks"))),
        Check("/debug/kv live_requests == 0", kv.get("live_requests") == 0, str(kv.get("live_requests"))),
        Check("/debug/kv blocks_in_sessions == 0 (all closed)", kv.get("blocks_in_sessions") == 0, str(kv.get("blocks_in_sessions"))),
        Check("/debug/kv blocks_free == blocks_usable", kv.get("blocks_free") == kv.get("blocks_usable"),
              f"{kv.get('blocks_free')} of {kv.get('blocks_usable')}"),
    ]


def metric_checks(t: Tally, m: dict[str, dict[str, float]], prefix_caching: bool) -> tuple[list[Check], dict]:
    """What /metrics must say, given what the client saw.

    A request the client saw complete was counted (request_success and the token counters are
    bumped before the answer is sent); one it cut may or may not have finished first. So
    completed <= success <= completed + cut, and the token counters equal the client's usage
    exactly when success == completed. Only a cut stream can make the engine abort a request (a
    whole request runs to its end whatever the client does): aborted <= streams cut. Each 429
    the client read was counted as a rejection; a whole request cut before its answer may have
    been one unseen: seen <= rejected(queue_full, rate_limit) <= seen + whole requests cut.
    """
    done = [o for o in t.outcomes if o.status == "complete"]
    completed = len(done)
    cut_streams, cut_whole = t.count("aborted", "abort_stream"), t.count("aborted", "abort_whole")
    seen_429 = sum(o.status == "refused" and o.code == 429 and not o.in_stream for o in t.outcomes)
    prompt_seen, gen_seen = sum(o.prompt_tokens for o in done), sum(o.completion_tokens for o in done)
    rejected = "swiftlm:request_rejected_total"
    got = {
        "request_success": metric(m, "swiftlm:request_success_total"),
        "prompt_tokens": metric(m, "swiftlm:prompt_tokens_total"),
        "generation_tokens": metric(m, "swiftlm:generation_tokens_total"),
        "num_aborted_requests": metric(m, "swiftlm:num_aborted_requests_total"),
        "rejected_429": metric(m, rejected, 'reason="queue_full"') + metric(m, rejected, 'reason="rate_limit"'),
        "rejected_bad_request": metric(m, rejected, 'reason="bad_request"'),
        "rejected_all": metric(m, rejected),
        "engine_failed_steps": metric(m, "swiftlm:engine_failed_steps_total"),
        "engine_failed_rows": metric(m, "swiftlm:engine_failed_rows_total"),
        "num_requests_running": metric(m, "swiftlm:num_requests_running"),
        "num_requests_waiting": metric(m, "swiftlm:num_requests_waiting"),
        "num_sessions": metric(m, "swiftlm:num_sessions"),
        "prefix_cache_queries": metric(m, "swiftlm:prefix_cache_queries_total"),
        "prefix_cache_hits": metric(m, "swiftlm:prefix_cache_hits_total"),
    }
    seen = {"completed": completed, "cut_streams": cut_streams, "cut_whole": cut_whole, "refused_429": seen_429,
            "prompt_tokens": prompt_seen, "generation_tokens": gen_seen}
    success = got["request_success"]
    exact = success == completed
    op = "==" if exact else ">="
    checks = [
        Check("request_success in [completed, completed + cut]", completed <= success <= completed + cut_streams + cut_whole,
              f"{success:g} vs completed {completed} + cut {cut_streams + cut_whole}"),
        Check(f"prompt_tokens {op} client usage", got["prompt_tokens"] == prompt_seen if exact else got["prompt_tokens"] >= prompt_seen,
              f"{got['prompt_tokens']:g} vs {prompt_seen}"),
        Check(f"generation_tokens {op} client usage",
              got["generation_tokens"] == gen_seen if exact else got["generation_tokens"] >= gen_seen,
              f"{got['generation_tokens']:g} vs {gen_seen}"),
        Check("num_aborted_requests <= streams cut", got["num_aborted_requests"] <= cut_streams,
              f"{got['num_aborted_requests']:g} vs {cut_streams}"),
        Check("rejected (429) in [429 seen, + whole cut]", seen_429 <= got["rejected_429"] <= seen_429 + cut_whole,
              f"{got['rejected_429']:g} vs seen {seen_429} (+{cut_whole} cut)"),
        Check("rejected bad_request == 0", got["rejected_bad_request"] == 0, f"{got['rejected_bad_request']:g}"),
        Check("no failed engine step or row", got["engine_failed_steps"] == got["engine_failed_rows"] == 0,
              f"steps {got['engine_failed_steps']:g}, rows {got['engine_failed_rows']:g}"),
        Check("nothing running or waiting; no session", got["num_requests_running"] == got["num_requests_waiting"] == got["num_sessions"] == 0,
              f"running {got['num_requests_running']:g}, waiting {got['num_requests_waiting']:g}, sessions {got['num_sessions']:g}"),
    ]
    if prefix_caching:
        checks.append(Check("prefix cache hits > 0", got["prefix_cache_hits"] > 0,
                            f"{got['prefix_cache_hits']:g} of {got['prefix_cache_queries']:g} tokens"))
    return checks, {"server": got, "client": seen}


# -- the run --------------------------------------------------------------------------------------
async def soak(args: argparse.Namespace, base_url: str, pid: int) -> dict:
    tally = Tally()
    sampler = RssSampler(pid)
    # keep-alive shorter than the server's (--timeout-keep-alive, 5 s by default): a connection the
    # server closes just as the client reuses it fails the request without a response
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=256, keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=base_url, timeout=args.request_timeout, limits=limits) as client:
        work = Workload(client, args, tally)
        sampling = asyncio.create_task(sampler.run())
        t_start = time.monotonic()
        capacity = await measure_capacity(work, args.capacity_clients, args.capacity_seconds)
        if capacity <= 0:
            raise SystemExit(f"error: no request completed in the {args.capacity_seconds}s capacity phase")
        rate = args.load_factor * capacity
        print(f"capacity {capacity:.2f} req/s; offering {rate:.2f} req/s for {args.duration:g}s", file=sys.stderr)
        t_load = time.monotonic()
        sent_load, load_s, running = await offer_load(work, rate, args.duration)
        t_load_end = time.monotonic()
        if running:
            await asyncio.wait(running, timeout=args.request_timeout + 10)
        await work.close_idle_sessions()
        kv = await wait_kv_settled(client)
        t_drained = time.monotonic()
        sampling.cancel()
        sampler.sample()
        found = parse_metrics((await client.get("/metrics")).text)
    warm_end = t_load + args.warmup_fraction * args.duration
    late = t_load_end - 0.1 * args.duration
    baseline, final = sampler.peak(t_start, warm_end), sampler.peak(late, t_drained)
    growth = 100.0 * (final - baseline) / baseline if baseline and final else float("nan")
    after = [(t, rss - pools) for t, rss, pools in sampler.samples if t >= warm_end]
    slope = statistics.linear_regression([t for t, _ in after], [m for _, m in after]).slope * 60 if len(after) > 2 else None
    vm_baseline, vm_final = sampler.peak(t_start, warm_end, outside=False), sampler.peak(late, t_drained, outside=False)
    completed_in_load = sum(o.status == "complete" and t_load <= o.finished_at <= t_load_end for o in tally.outcomes)
    statuses = Counter(o.status for o in tally.outcomes)
    refused = Counter(str(o.code) + ("-in-stream" if o.in_stream else "") for o in tally.outcomes if o.status == "refused")
    prefix_caching = "--no-enable-prefix-caching" not in args.serve_args
    m_checks, comparisons = metric_checks(tally, found, prefix_caching)
    checks = [
        *client_checks(tally),
        Check(f"RSS growth after warm-up <= {args.max_rss_growth:g}%", growth <= args.max_rss_growth,
              f"{baseline:.1f} -> {final:.1f} MiB ({growth:+.2f}%) outside the huge-page buffers"),
        *kv_checks(kv),
        *m_checks,
    ]
    return {
        "requests_sent": len(tally.outcomes),
        "requests_sent_load_phase": sent_load,
        "completed": statuses["complete"],
        "refused_by_code": dict(refused),
        "client_aborted": statuses["aborted"],
        "server_errors_5xx": statuses["server_error"],
        "other_failures": statuses["bad"],
        "timeouts": statuses["timeout"],
        "by_kind": {k: dict(Counter(o.status for o in tally.outcomes if o.kind == k)) for k in KINDS},
        "sessions": {"opened": tally.sessions_opened, "used": tally.sessions_used, "delete_codes": dict(tally.deletes)},
        "capacity_rps": capacity,
        "offered_rps": rate,
        "arrival_rps": sent_load / load_s if load_s else 0.0,
        "achieved_rps": completed_in_load / load_s if load_s else 0.0,  # answers completed during the load phase
        "rss_mib": {
            "checked": "RSS outside the huge-page buffers (weights arena, KV pools faulted in on first use)",
            "baseline": baseline, "final": final, "growth_pct": growth, "slope_mib_per_min_after_warmup": slope,
            "vmrss_baseline": vm_baseline, "vmrss_final": vm_final,
            "vmrss_peak": max((rss for _, rss, _ in sampler.samples), default=None),
            "samples": len(sampler.samples), "warmup_end_s": warm_end - t_start, "load_end_s": t_load_end - t_start,
            "series": [(round(t - t_start, 2), round(rss, 1), round(pools, 1)) for t, rss, pools in sampler.samples],
        },
        "kv": kv,
        "metrics": comparisons,
        "duration_s": {"capacity": t_load - t_start, "load": load_s, "drain": t_drained - t_load_end,
                       "total": t_drained - t_start},
        "checks": [asdict(c) for c in checks],
    }


def stop_server(proc: subprocess.Popen, timeout_s: float = 60.0) -> int | None:
    """SIGTERM and wait; the exit status, or None if it had to be killed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        return None


def print_summary(s: dict) -> None:
    rss = s["rss_mib"]
    rows = [
        ("requests sent", s["requests_sent"]), ("completed", s["completed"]),
        ("refused by code", s["refused_by_code"] or "-"), ("client-aborted", s["client_aborted"]),
        ("5xx", s["server_errors_5xx"]), ("other failures / timeouts", f"{s['other_failures']} / {s['timeouts']}"),
        ("sessions opened / used", f"{s['sessions']['opened']} / {s['sessions']['used']}"),
        ("capacity", f"{s['capacity_rps']:.2f} req/s"), ("offered", f"{s['offered_rps']:.2f} req/s"),
        ("arrivals", f"{s['arrival_rps']:.2f} req/s"), ("achieved", f"{s['achieved_rps']:.2f} completed/s"),
        ("RSS baseline / final", f"{rss['baseline']:.1f} / {rss['final']:.1f} MiB ({rss['growth_pct']:+.2f}%), "
                                 "outside huge-page buffers"),
        ("VmRSS baseline / final", f"{rss['vmrss_baseline']:.1f} / {rss['vmrss_final']:.1f} MiB"),
        ("duration", f"{s['duration_s']['total']:.1f} s (load {s['duration_s']['load']:.1f} s)"),
    ]
    for name, value in rows:
        print(f"{name:<28} {value}")
    print()
    for check in s["checks"]:
        print(f"{'PASS' if check['ok'] else 'FAIL'}  {check['name']:<52} {check['detail']}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else list(argv)
    serve_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="flags after -- go to swiftlm serve")
    p.add_argument("model", help="model directory (or hub id) for swiftlm serve")
    p.add_argument("--duration", type=float, default=600.0, help="load phase, seconds (default: 600)")
    p.add_argument("--load-factor", type=float, default=2.0, help="offered rate / measured capacity (default: 2)")
    p.add_argument("--capacity-seconds", type=float, default=15.0, help="closed-loop capacity phase (default: 15)")
    p.add_argument("--capacity-clients", type=int,
                   help="closed-loop clients in the capacity phase (default: serve's --max-num-seqs, else 32)")
    p.add_argument("--warmup-fraction", type=float, default=0.15,
                   help="share of the load phase that is still warm-up for the RSS baseline (default: 0.15)")
    p.add_argument("--max-rss-growth", type=float, default=5.0, help="allowed RSS growth after warm-up, %% (default: 5)")
    p.add_argument("--min-tokens", type=int, default=4, help="smallest random max_tokens (default: 4)")
    p.add_argument("--max-tokens", type=int, default=48, help="largest random max_tokens (default: 48)")
    p.add_argument("--prefix-words", type=int, default=300, help="words in each shared long prefix (default: 300)")
    p.add_argument("--request-timeout", type=float, default=120.0, help="per-request timeout, seconds (default: 120)")
    p.add_argument("--start-timeout", type=float, default=180.0, help="seconds to wait for /health (default: 180)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="write the summary here")
    p.add_argument("--server-log", metavar="PATH", help="the server's log (default: in a temporary directory)")
    args = p.parse_args(argv)
    args.serve_args = serve_args
    if args.capacity_clients is None:
        given = serve_args.index("--max-num-seqs") if "--max-num-seqs" in serve_args else None
        args.capacity_clients = int(serve_args[given + 1]) if given is not None and given + 1 < len(serve_args) else 32
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="swiftlm-soak-"))
    port = free_port()
    t0 = time.monotonic()
    proc, server_argv, log_path = start_server(args, port, workdir)
    base_url = f"http://127.0.0.1:{port}"
    try:
        healthy = wait_healthy(proc, base_url, args.start_timeout)
        startup_s = time.monotonic() - t0
        if not healthy:
            print(f"error: the server did not become healthy; its log ({log_path}):\n{log_path.read_text()[-3000:]}",
                  file=sys.stderr)
            return 1
        summary = asyncio.run(soak(args, base_url, proc.pid))
    finally:
        t_stop = time.monotonic()
        exit_code = stop_server(proc)
    summary["duration_s"] |= {"server_start": startup_s, "server_stop": time.monotonic() - t_stop}
    log = log_path.read_text(errors="replace")
    tracebacks = log.count("Traceback (most recent call last)")
    summary["checks"] += [
        asdict(Check("server exits 0 on SIGTERM", exit_code == 0, f"exit status {exit_code}")),
        asdict(Check("no traceback in the server log", tracebacks == 0, f"{tracebacks} in {log_path}")),
    ]
    summary["server_command"] = server_argv
    summary["server_log"] = str(log_path)
    summary["passed"] = all(c["ok"] for c in summary["checks"])
    print_summary(summary)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    if not summary["passed"]:
        tail = "\n".join(line for line in log.splitlines()[-40:])
        print(f"\nserver log tail ({log_path}):\n{tail}", file=sys.stderr)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
