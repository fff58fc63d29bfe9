"""Per-key rate limits: requests and tokens per minute over a sliding 60-second window.

A request is admitted when its caller has sent fewer than ``rpm`` requests in the window and the
tokens charged in the window plus the request's prompt fit in ``tpm``. The prompt is charged at
admission, generated tokens as they are produced, so a long stream counts while it runs. A refusal
is a 429 with ``Retry-After``: the time until enough of the window has passed. Limits are per
caller (``swiftlm.server.operations.auth.Caller``), never global; Batch API lines are not limited here
(they wait at background priority instead).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from swiftlm.server.errors import OpenAIError, too_many_requests
from swiftlm.server.operations.auth import Caller

WINDOW_S = 60.0
_MAX_IDLE_WINDOWS = 10_000  # windows kept for callers that used nothing lately (then dropped)


@dataclass(slots=True)
class _Window:
    requests: deque[float] = field(default_factory=deque)  # arrival times
    tokens: deque[tuple[float, int]] = field(default_factory=deque)  # (time, tokens charged)
    token_sum: int = 0

    def prune(self, now: float) -> None:
        start = now - WINDOW_S
        while self.requests and self.requests[0] <= start:
            self.requests.popleft()
        while self.tokens and self.tokens[0][0] <= start:
            self.token_sum -= self.tokens.popleft()[1]

    def tokens_free_at(self, needed: int) -> float:
        """When the window will have dropped at least ``needed`` charged tokens."""
        freed = 0
        for t, n in self.tokens:
            freed += n
            if freed >= needed:
                return t + WINDOW_S
        return self.tokens[-1][0] + WINDOW_S if self.tokens else 0.0


class RateLimits:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._windows: dict[str, _Window] = {}

    def admit(self, caller: Caller, prompt_tokens: int) -> None:
        """Count one request of ``caller`` with ``prompt_tokens``, or raise a 429 (nothing counted)."""
        if caller.background or (caller.rpm is None and caller.tpm is None):
            return
        now = self._clock()
        window = self._window(caller.scope, now)
        if caller.rpm is not None and len(window.requests) >= caller.rpm:
            wait = window.requests[0] + WINDOW_S - now
            raise _limited(caller, "requests per minute (RPM)", caller.rpm, len(window.requests), 1, wait)
        if caller.tpm is not None and window.token_sum + prompt_tokens > caller.tpm:
            if prompt_tokens > caller.tpm:
                raise too_many_requests(None, (
                    f"Request too large for key '{caller.name}' on tokens per minute (TPM): limit {caller.tpm}, "
                    f"requested {prompt_tokens}. Send a shorter prompt."))
            wait = window.tokens_free_at(window.token_sum + prompt_tokens - caller.tpm) - now
            raise _limited(caller, "tokens per minute (TPM)", caller.tpm, window.token_sum, prompt_tokens, wait)
        window.requests.append(now)
        if caller.tpm is not None:
            self._charge(window, now, prompt_tokens)

    def charge(self, caller: Caller, tokens: int) -> None:
        """Count ``tokens`` generated for ``caller`` (they count against its TPM from now)."""
        if caller.background or caller.tpm is None or tokens <= 0:
            return
        now = self._clock()
        self._charge(self._window(caller.scope, now), now, tokens)

    def used(self, caller: Caller) -> tuple[int, int]:
        """(requests, tokens) counted for ``caller`` in the current window."""
        window = self._windows.get(caller.scope)
        if window is None:
            return 0, 0
        window.prune(self._clock())
        return len(window.requests), window.token_sum

    def _charge(self, window: _Window, now: float, tokens: int) -> None:
        if tokens > 0:
            window.tokens.append((now, tokens))
            window.token_sum += tokens

    def _window(self, scope: str, now: float) -> _Window:
        window = self._windows.get(scope)
        if window is None:
            if len(self._windows) >= _MAX_IDLE_WINDOWS:
                self._drop_idle(now)
            window = self._windows[scope] = _Window()
        window.prune(now)
        return window

    def _drop_idle(self, now: float) -> None:
        for scope, window in list(self._windows.items()):
            window.prune(now)
            if not window.requests and not window.tokens:
                del self._windows[scope]


def _limited(caller: Caller, what: str, limit: int, used: int, requested: int, wait_s: float) -> OpenAIError:
    wait_s = max(wait_s, 0.001)
    return too_many_requests(wait_s, (
        f"Rate limit reached for key '{caller.name}' on {what}: limit {limit}, used {used}, requested "
        f"{requested}. Please try again in {math.ceil(wait_s)}s."))
