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


def build_or_skip(build: str, load: Callable[[], object | None], load_variant: Callable[[str, tuple[str, ...]], object | None],
                  namespace: str, flags: Sequence[str], what: str) -> object:
    """``build`` "native": ``kernel_or_skip``; "avx2": on an AVX-512 CPU the AVX2 code of the same source
    built apart under ``namespace`` (``-mno-avx512f``), a failure when it does not load, else a skip
    (there the native build is the AVX2 one)."""
    native = kernel_or_skip(load, flags, what)
    if build == "native":
        return native
    if "avx512f" not in cpu_flags():
        pytest.skip("the native build is the AVX2 one on this CPU")
    variant = load_variant(namespace, ("-mno-avx512f",))
    assert variant is not None, f"the AVX2 build of the {what} failed on a CPU with AVX2; see the log"
    return variant
