"""A submitted request's outputs as text, read from the engine loop's token ids in the reader's
thread (the server's event loop): the loop thread never detokenises or matches stop strings."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from swiftlm.core.outputs import RequestOutput
from swiftlm.engine.async_engine import RequestStream
from swiftlm.frontend.output_processor import RequestText


class TextStream:
    """``RequestStream``'s interface (``request_id``, ``observe``, iteration, ``final``), with text.

    A stop string ends a sequence here: the engine is told to end it there too, and the finished
    output is read only once it has (``AsyncEngine.stop_sequences``). Leaving the iteration before the
    request finished aborts it, as ``RequestStream`` does."""

    def __init__(self, tokens: RequestStream, text: RequestText) -> None:
        self.request_id = tokens.request_id
        self._tokens = tokens
        self._text = text
        self._observers: list[Callable[[RequestOutput], None]] = []

    def observe(self, fn: Callable[[RequestOutput], None]) -> None:
        """Call ``fn`` with every output as it is read (e.g. to count tokens while streaming)."""
        self._observers.append(fn)

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        async for item in self._tokens:
            out, stops = self._text.process(item)
            if stops:
                await self._tokens.engine.stop_sequences(stops)
            if out is None:
                continue  # a whole answer, not finished yet
            for fn in self._observers:
                fn(out)
            if out.finished:
                self._tokens.settle()  # ended here on a stop string, or by the engine: nothing to abort
            yield out
            if out.finished:
                return

    final = RequestStream.final  # reads this stream to its finished output
