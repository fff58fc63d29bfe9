"""A/B runs: the same workload against two configurations, in interleaved rounds A, B, A, B, ...
so that drift on a noisy machine hits both sides alike.

A side is a base URL (a server someone else runs) or the arguments of `swiftlm serve`, in which
case this module starts the server (`python -m swiftlm.cli serve ARGS --host 127.0.0.1 --port P`),
waits for GET /health to answer 200, and stops it with SIGTERM at the end (or after each of its
rounds with `restart_per_round`). Round r of both sides uses the same workload (seed + r).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from swiftlm.bench.client import LoadConfig, RunResult, run_load_sync
from swiftlm.bench.text_gen import TokenCounter
from swiftlm.bench.workloads import BenchRequest, WorkloadOptions, build_workload
from swiftlm.threads import all_cpus

SERVE_COMMAND = (sys.executable, "-m", "swiftlm.cli", "serve")


class ServerStartError(RuntimeError):
    """A `swiftlm serve` child did not become healthy."""


@dataclass(frozen=True)
class Target:
    """One side of an A/B run: a base URL, or `swiftlm serve` arguments."""

    label: str
    base_url: str | None = None
    serve_args: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.base_url or "swiftlm serve " + shlex.join(self.serve_args)


def parse_target(label: str, spec: str) -> Target:
    """ "http://host:port" -> a URL target; anything else is split like a shell into serve args."""
    spec = spec.strip()
    if re.match(r"^https?://", spec):
        return Target(label, base_url=spec)
    args = tuple(shlex.split(spec))
    if not args:
        raise ValueError(f"side {label} is empty: give a base URL or the arguments of `swiftlm serve`")
    return Target(label, serve_args=args)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _option(args: Sequence[str], name: str) -> str | None:
    """The value of `--name V` or `--name=V` in `args`."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _temp_log_path() -> Path:
    with tempfile.NamedTemporaryFile(prefix="swiftlm-serve-", suffix=".log", delete=False) as f:
        return Path(f.name)


class ServeProcess:
    """A `swiftlm serve` child process; use as a context manager (start + wait ready / stop).

    `--host` and `--port` are added unless the arguments give them (port: a free one).
    Output goes to a log file whose tail is shown when the server fails to start."""

    def __init__(
        self,
        serve_args: Sequence[str],
        startup_timeout_s: float = 600.0,
        command: Sequence[str] = SERVE_COMMAND,
        log_path: str | Path | None = None,
    ) -> None:
        args = list(serve_args)
        self.host = _option(args, "--host") or "127.0.0.1"
        port = _option(args, "--port")
        self.port = int(port) if port else free_port(self.host)
        args += [] if _option(args, "--host") else ["--host", self.host]
        args += [] if port else ["--port", str(self.port)]
        self.argv = [*command, *args]
        self.startup_timeout_s = startup_timeout_s
        self.log_path = Path(log_path) if log_path else _temp_log_path()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            # A session of its own, so stop() can signal the server and any workers it spawned;
            # all CPUs, whatever core this process's main thread is bound to (see threads.all_cpus).
            with all_cpus():
                self.proc = subprocess.Popen(
                    self.argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        self.wait_ready()

    def _log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerStartError(
                    f"`{shlex.join(self.argv)}` exited with code {self.proc.returncode} before it "
                    f"was healthy; its output ends:\n{self._log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200:
                    return
            time.sleep(0.25)
        self.stop()
        raise ServerStartError(
            f"`{shlex.join(self.argv)}` was not healthy after {self.startup_timeout_s:g} s "
            f"(GET {self.base_url}/health); its output ends:\n{self._log_tail()}"
        )

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM to the server's process group, SIGKILL after `grace_s`; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self._signal_group(signal.SIGTERM)
        try:
            return self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            return self.proc.wait()

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)  # the group start_new_session made: this server only
        except ProcessLookupError:
            pass

    def __enter__(self) -> ServeProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class ABConfig:
    """What each round sends; `rounds` is the number of A, B pairs."""

    workload: str = "qa"
    options: WorkloadOptions = field(default_factory=WorkloadOptions)
    seed: int = 0
    rounds: int = 2
    concurrency: int = 4
    num_requests: int | None = 32
    duration_s: float | None = None
    stream: bool = True
    model: str | None = None
    api_key: str | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    # per side (keys "A" and "B"): fields merged over extra_body, and a stream setting of its own,
    # for A/B tests of request options against one server (e.g. thinking on + streaming vs off)
    side_extra_body: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    side_stream: Mapping[str, bool] = field(default_factory=dict)
    timeout_s: float = 300.0
    warmup: int = 0
    restart_per_round: bool = False
    startup_timeout_s: float = 600.0
    show_progress: bool = True
    serve_command: tuple[str, ...] = SERVE_COMMAND  # what serve args are appended to

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"rounds must be at least 1, got {self.rounds}")
        if (self.num_requests is None) == (self.duration_s is None):
            raise ValueError("give exactly one of num_requests and duration_s")

    def stream_for(self, side: str) -> bool:
        return self.side_stream.get(side, self.stream)

    def extra_body_for(self, side: str) -> dict[str, Any]:
        return {**self.extra_body, **self.side_extra_body.get(side, {})}


class _Servers:
    """The base URL of each side, starting `swiftlm serve` children as needed."""

    def __init__(self, stack: contextlib.ExitStack, config: ABConfig, log_dir: Path | None) -> None:
        self.stack, self.config, self.log_dir = stack, config, log_dir
        self.running: dict[str, ServeProcess] = {}

    @contextlib.contextmanager
    def url(self, target: Target, round_index: int) -> Iterator[str]:
        if target.base_url is not None:
            yield target.base_url
            return
        if target.label not in self.running:
            log = self.log_dir / f"serve_{target.label}_round{round_index}.log" if self.log_dir else None
            proc = ServeProcess(
                target.serve_args, self.config.startup_timeout_s, self.config.serve_command, log_path=log
            )
            self.stack.callback(proc.stop)
            proc.start()
            self.running[target.label] = proc
        yield self.running[target.label].base_url
        if self.config.restart_per_round:
            self.running.pop(target.label).stop()


def _for_side(requests: list[BenchRequest], label: str) -> list[BenchRequest]:
    """The round's requests with session ids of their own, so two sides never share a session."""
    return [
        r if r.session_id is None else dataclasses.replace(r, session_id=f"{r.session_id}-{label}")
        for r in requests
    ]


def run_ab(
    a: Target,
    b: Target,
    config: ABConfig,
    count_tokens: TokenCounter | None = None,
    log_dir: str | Path | None = None,
) -> tuple[list[RunResult], list[RunResult]]:
    """Run rounds A, B, A, B, ... and return each side's results, one per round."""
    results: dict[str, list[RunResult]] = {a.label: [], b.label: []}
    nonce = f"ab-{os.getpid()}-{int(time.time())}"
    with contextlib.ExitStack() as stack:
        servers = _Servers(stack, config, Path(log_dir) if log_dir else None)
        for rnd in range(config.rounds):
            seed, opts, n = config.seed + rnd, config.options, config.num_requests or 256
            requests = build_workload(config.workload, n, seed, count_tokens, opts, f"{nonce}-r{rnd}")
            warmup = build_workload(
                config.workload, config.warmup, seed + 100_000, count_tokens, opts, f"{nonce}-w{rnd}"
            )
            for target in (a, b):
                with servers.url(target, rnd) as url:
                    load = LoadConfig(
                        url,
                        model=config.model,
                        concurrency=config.concurrency,
                        num_requests=config.num_requests,
                        duration_s=config.duration_s,
                        stream=config.stream_for(target.label),
                        timeout_s=config.timeout_s,
                        api_key=config.api_key,
                        extra_body=config.extra_body_for(target.label),
                        show_progress=config.show_progress,
                    )
                    side = target.label
                    results[side].append(
                        run_load_sync(_for_side(requests, side), load, _for_side(warmup, side))
                    )
    return results[a.label], results[b.label]
