"""The CUDA backend's Triton code, imported under Triton's interpreter so it runs on CPU tensors.

Triton reads ``TRITON_INTERPRET`` when it is imported, when a kernel is decorated and when a kernel
runs, so triton and the kernel modules are imported here with it set, and the test modules set it
again around their own tests only (``interpreter_env``, a module-scoped autouse fixture): other
tests never see it. Triton must not have been imported before in the process (nothing else in the
suite imports it at collection, but loading a transformers model does, through torch._dynamo:
so the test modules call ``import_interpreted`` when they are collected, before any test runs); if
it was, ``import_interpreted`` fails loudly rather than test compiled kernels that cannot run here. Test modules check that triton is installed
(``triton_installed``) without importing it."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

_MODULES = (
    "swiftlm.backends.cuda.kernels.tile_ops",
    "swiftlm.backends.cuda.kernels.store_kv",
    "swiftlm.backends.cuda.kernels.decode_attention",
    "swiftlm.backends.cuda.kernels.prefill_attention",
    "swiftlm.backends.cuda.kernels.fused_ops",
    "swiftlm.backends.cuda.attention",
    "swiftlm.backends.cuda.backend",
)


@contextmanager
def interpreter_env() -> Iterator[None]:
    """``TRITON_INTERPRET=1`` inside the block, the previous value after it."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def import_interpreted() -> dict[str, ModuleType]:
    """The kernel and backend modules, their kernels decorated for the interpreter."""
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        standard = sys.modules.get("triton.language.standard")
        if standard is None or type(standard.zeros).__name__ != "InterpretedFunction":
            raise RuntimeError("triton was imported before without TRITON_INTERPRET=1; run the Triton tests "
                               "in a process of their own (pytest tests/unit/test_triton_kernels.py)")
    with interpreter_env():
        import triton  # noqa: F401  (under the interpreter: its own library functions run on CPU)

        for name in _MODULES:  # decorated earlier without the interpreter: decorate again
            sys.modules.pop(name, None)
        return {name.rsplit(".", 1)[1]: importlib.import_module(name) for name in _MODULES}
