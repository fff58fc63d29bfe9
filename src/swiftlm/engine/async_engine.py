"""AsyncEngine: the engine loop on one background thread, driven from asyncio.

Only the loop thread touches the Engine. Other threads talk to it through a command queue
(submit, abort, close a session) and get outputs back through one asyncio.Queue per request,
filled with ``loop.call_soon_threadsafe``. Validation and the queue-length check run in the
caller's thread, so a bad or refused request fails at once, before any response is started.

The loop thread only steps the engine: its outputs are token ids. The front end turns them into
text as they are read (``swiftlm.frontend.text_stream``), in the reader's thread; a stop string it
finds there ends the sequence in the engine (``stop_sequences``, awaited) before the finished output
is read, so a session's next turn always finds the stream the client saw.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from swiftlm.core.generation import GenerationRequest
from swiftlm.core.outputs import RequestOutput, SequenceStop
from swiftlm.engine.engine import Engine
from swiftlm.engine.scheduler import QueueFullError

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine is shutting down or its loop stopped; the server answers 503."""


@dataclass(slots=True)
class _Channel:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue

    def put(self, item: RequestOutput | BaseException) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class RequestStream:
    """The output deltas of one submitted request. Leaving the iteration before the request
    finished (client gone, task cancelled) aborts it and frees its blocks."""

    def __init__(self, engine: AsyncEngine, request_id: str, channel: _Channel) -> None:
        self.request_id = request_id
        self.engine = engine
        self._channel = channel
        self._settled = False  # the caller ended the request in the engine itself (``settle``)
        self._observers: list[Callable[[RequestOutput], None]] = []

    def observe(self, fn: Callable[[RequestOutput], None]) -> None:
        """Call ``fn`` with every output as it is read (e.g. to count tokens while streaming)."""
        self._observers.append(fn)

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        finished = False
        try:
            while True:
                item = await self._channel.queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                for fn in self._observers:
                    fn(item)
                yield item
                if finished:
                    return
        finally:
            if not finished and not self._settled:
                self.engine.abort(self.request_id)

    def settle(self) -> None:
        """The caller has ended the request in the engine (``AsyncEngine.stop_sequences``): leaving
        the iteration now does not abort it."""
        self._settled = True

    async def final(self) -> RequestOutput:
        """Wait for the finished output (with ``final_only`` it is the only one)."""
        last = None
        async for out in self:
            last = out
        assert last is not None
        return last


class AsyncEngine:
    def __init__(self, engine: Engine, idle_wait_s: float = 0.05) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self._commands: queue.SimpleQueue[Callable[[], Any]] = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._channels: dict[str, _Channel] = {}
        self._pending_adds = 0
        self._count_lock = threading.Lock()
        self._accepting = True
        self._stop = False
        self._idle_wait_s = idle_wait_s
        self._thread = threading.Thread(target=self._loop, name="swiftlm-engine", daemon=True)
        self._thread.start()

    # -- public API (any thread / asyncio) ------------------------------------------------------
    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._stop

    def num_queued(self) -> int:
        """Requests accepted but not yet admitted to the running batch."""
        return self._pending_adds + len(self.engine.scheduler.waiting)

    def submit(self, request: GenerationRequest, validated: bool = False) -> RequestStream:
        """Queue a request; iterate the returned stream (in the calling event loop) for its
        output deltas, the last one with ``finished``. With ``request.final_only`` just the
        finished output is sent (no per-token wake-ups for callers that wait for the whole answer).
        The request arrives now, unless it carries an ``arrival_time``.

        Raises at once: RequestError (bad request), QueueFullError (queue full), EngineDeadError.
        """
        if not self._accepting or not self.is_running:
            raise EngineDeadError("the engine is shutting down")
        if not validated:  # the front end that checked it (``Engine.validate``) says so
            self.engine.validate(request.prompt_token_ids, request.sampling_params)
        limit = self.engine.config.scheduler.max_queued_requests
        counted = not request.background  # Batch API lines wait in their own queue, outside the limit
        with self._count_lock:
            if counted and self.num_queued() >= limit:
                raise QueueFullError(f"{limit} requests are already waiting (max_queued_requests); retry later")
            self._pending_adds += counted
        request_id = request.request_id
        channel = _Channel(asyncio.get_running_loop(), asyncio.Queue())
        self._channels[request_id] = channel
        if request.arrival_time is None:
            request = replace(request, arrival_time=time.monotonic())

        def add() -> None:
            with self._count_lock:
                self._pending_adds -= counted
            try:
                self.engine.add_request(request, validated=True)  # validated above, in the caller's thread
            except Exception as exc:  # the queue filled up meanwhile
                self._channels.pop(request_id, None)
                channel.put(exc)

        self._submit(add)
        return RequestStream(self, request_id, channel)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]:
        """``submit`` and iterate in one call (errors surface at the first iteration)."""
        async for out in self.submit(request):
            yield out

    def session_tokens(self, session_id: str) -> list[int] | None:
        """The session's token stream as the cache holds it (``Engine.session_tokens``), read from
        the calling thread: one dict lookup of a list the engine replaces but never changes."""
        return self.engine.session_tokens(session_id)

    def abort(self, request_id: str) -> None:
        self._channels.pop(request_id, None)
        self._submit(lambda: self.engine.abort(request_id))

    async def stop_sequences(self, stops: list[SequenceStop]) -> None:
        """End sequences a stop string ended (``Engine.stop_sequence``), on the loop thread, and
        return once it is done."""
        future: Future[None] = Future()

        def stop() -> None:
            try:
                for s in stops:
                    if self.engine.stop_sequence(s):
                        self._channels.pop(s.request_id, None)  # the engine has no more to say of it
                future.set_result(None)
            except Exception as exc:
                future.set_exception(exc)

        self._submit(stop)
        await asyncio.wrap_future(future)

    async def close_session(self, session_id: str) -> bool:
        future: Future[bool] = Future()
        self._submit(lambda: future.set_result(self.engine.close_session(session_id)))
        return await asyncio.wrap_future(future)

    async def run_in_engine(self, fn: Callable[[Engine], Any]) -> Any:
        """Run ``fn(engine)`` on the loop thread between steps (tests, admin)."""
        future: Future[Any] = Future()

        def call() -> None:
            try:
                future.set_result(fn(self.engine))
            except Exception as exc:
                future.set_exception(exc)

        self._submit(call)
        return await asyncio.wrap_future(future)

    def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        """Stop accepting requests, let in-flight ones finish (up to the timeout), stop the loop."""
        self._accepting = False
        deadline = time.monotonic() + drain_timeout_s
        while time.monotonic() < deadline and (self.engine.has_unfinished() or self._pending_adds):
            time.sleep(0.02)
        self._stop = True
        self._wakeup.set()
        self._thread.join(timeout=5.0)
        for rid, channel in list(self._channels.items()):
            channel.put(EngineDeadError("the server shut down before the request finished"))
            self._channels.pop(rid, None)

    # -- the loop thread ----------------------------------------------------------------------------
    def _submit(self, command: Callable[[], Any]) -> None:
        self._commands.put(command)
        self._wakeup.set()

    def _drain_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                command()
            except Exception:
                logger.exception("engine command failed")

    def _loop(self) -> None:
        while not self._stop:
            self._drain_commands()
            if not self.engine.has_unfinished():
                self._wakeup.wait(self._idle_wait_s)
                self._wakeup.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # a bug in a step must not take the server down
                logger.exception("engine step failed; failing the requests in flight")
                outputs = self.engine.fail_all(f"internal error: {exc}")
            for out in outputs:
                channel = self._channels.get(out.request_id)
                if channel is not None:
                    channel.put(out)
                    if out.finished:
                        self._channels.pop(out.request_id, None)
