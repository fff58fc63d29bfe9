"""Launched steps: the host builds a step, the device's thread computes it, the host lands its results.

With overlapped steps (``EngineConfig.async_scheduling``) one step is always in flight while the
host works on the next:

    host:    schedule N+1 | build N+1 | launch N+1 | land N (append, stops, free) | emit N | schedule N+2 ...
    device:  ... step N ...............................| step N+1 ............................| step N+2

``DeviceThread`` runs the launched steps one after another, in launch order, on one thread: a
step reads what the steps before it wrote (KV, the block copies, the tokens they sampled), so FIFO
order is all the synchronisation the KV pools need. Serial steps run their job inline, on the
caller's thread, when they land.

A job launches its step (``ModelRunner.launch``): on a CPU that is the whole computation; on CUDA
the kernels are queued and a plain greedy step's tokens stay on the device, where the next step
reads its pending input tokens, so the thread never waits for the GPU and the next step is queued
before this one ends. Landing reads the results (``ModelRunner.collect``), waiting for this step's
kernels only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from swiftlm.core.schedule import SchedulerOutput
from swiftlm.runner.runner import LaunchedRun

StepEvent = Callable[[str, int, float], None]  # (kind, step index, time.perf_counter())


class DeviceThread:
    """One worker thread that runs launched steps in launch order (started on first use)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], LaunchedRun]) -> Future[LaunchedRun]:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swiftlm-device")
            return self._pool.submit(job)

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None


@dataclass(slots=True)
class LaunchedStep:
    """A step whose inputs are built and whose counts are advanced, computed by ``job``: on the
    device thread (``future``) when steps overlap, else inline when it lands."""

    index: int
    plan: SchedulerOutput
    samples: list[bool]  # per scheduled request: whether it samples this step
    epochs: list[int]  # per scheduled request: its preemption count at launch (a preemption drops the KV)
    rows_of: dict[int, int]  # id(request) -> its first sampled row (where the next step finds its token)
    job: Callable[[], LaunchedRun]
    decode_only: bool  # speculating, and every scheduled request decodes (speculation times these steps)
    launched_at: float = field(default_factory=time.perf_counter)
    future: Future[LaunchedRun] | None = None

    def result(self) -> LaunchedRun:
        """Wait for the step's launch (or launch it here, serial); raises what it raised."""
        if self.future is None:
            self.future = Future()
            try:
                self.future.set_result(self.job())
            except BaseException as exc:
                self.future.set_exception(exc)
        return self.future.result()

    def tokens_for_next(self, num_rows: int, device: str) -> torch.Tensor:
        """[S] the tokens its sampled rows drew, where they are (on the device), for the step after
        it (zeros if it failed: the requests that read them failed with it, and their rows are dropped)."""
        try:
            tokens = self.result().tokens
        except Exception:
            tokens = None
        return tokens if tokens is not None else torch.zeros(num_rows, dtype=torch.int64, device=device)
