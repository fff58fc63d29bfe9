"""A compiled CPU kernel for a test module: the op, a failure when the CPU has its instruction sets
but it did not load (a broken build must not hide behind a skip), else a skip naming what is missing."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from swiftlm.platform import cpu_flags


def kernel_or_skip(load: Callable[[], object | None], flags: Sequence[str], what: str) -> object:
    op = load()
    if op is None:
        if all(f in cpu_flags() for f in flags):
            pytest.fail(f"the CPU has {tuple(flags)} but the {what} did not load; see the log")
        pytest.skip(f"{what} unavailable: CPU lacks {tuple(flags)}")
    return op
