"""Compile a C++ source kept in this package into a torch op library, once per source and machine.

The build directory is named by a digest of the source and the headers next to it that it
includes, the compiler flags, the torch version and the CPU's feature flags (``-march=native``
code must not move to another CPU), so an unchanged
kernel loads straight from the cache and a changed one gets a fresh build. Concurrent first builds
are serialised by torch's lock file in the build directory.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from swiftlm.platform import cpu_flags, cpu_isa_override, user_cache_dir
from swiftlm.threads import all_cpus

logger = logging.getLogger(__name__)

CPU_CFLAGS = ("-O3", "-march=native", "-fopenmp")
# SWIFTLM_CPU_ISA=avx2 / avx512 (platform.py): the native build without AVX-512 and AMX / without AMX
NO_AMX_CFLAGS = ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16")
AVX2_ONLY_CFLAGS = ("-mno-avx512f", *NO_AMX_CFLAGS)
ISA_CFLAGS = {"avx2": AVX2_ONLY_CFLAGS, "avx512": NO_AMX_CFLAGS}
CPU_LDFLAGS = ("-fopenmp",)
_DONE = "build.done"


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``bfloat16``: how the kernels' ``supports()`` name a dtype they refuse."""
    return str(dtype).removeprefix("torch.")


def cache_dir() -> Path:
    """``$SWIFTLM_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/swiftlm/backends/cpu/kernels`` (``~/.cache`` by default)."""
    explicit = os.environ.get("SWIFTLM_KERNEL_CACHE")
    if explicit:
        return Path(explicit)
    return user_cache_dir() / "kernels"


def local_includes(source: Path) -> list[Path]:
    """The headers next to ``source`` that it includes with ``#include "name"`` (one level)."""
    names = re.findall(r'^\s*#\s*include\s+"([^"]+)"', source.read_text(), flags=re.MULTILINE)
    return [source.parent / name for name in names]


def load_cpu_op_library(
    name: str, source: Path, cflags: Sequence[str] = CPU_CFLAGS, ldflags: Sequence[str] = CPU_LDFLAGS
) -> Path:
    """Build (if needed) and load ``source``, which registers its ops with ``TORCH_LIBRARY``.

    Returns the loaded library's path; raises whatever the compiler or loader raised.
    """
    override = cpu_isa_override()
    if override is not None:
        cflags = (*cflags, *ISA_CFLAGS[override])
    key = hashlib.sha256()
    for part in (
        source.read_bytes(),
        *(header.read_bytes() for header in local_includes(source)),
        " ".join(cflags).encode(),
        " ".join(ldflags).encode(),
        torch.__version__.encode(),
        " ".join(sorted(cpu_flags())).encode(),
    ):
        key.update(part)
        key.update(b"\0")
    ext_name = f"{name}_{key.hexdigest()[:12]}"
    build_dir = cache_dir() / ext_name
    library = build_dir / f"{ext_name}.so"
    if (build_dir / _DONE).exists() and library.exists():
        torch.ops.load_library(str(library))
        return library

    from torch.utils import cpp_extension

    build_dir.mkdir(parents=True, exist_ok=True)
    logger.info("compiling %s into %s (about a minute, once)", source.name, build_dir)
    start = time.perf_counter()
    with all_cpus():  # the compiler processes on every CPU, not the core OpenMP bound this thread to
        cpp_extension.load(
            name=ext_name,
            sources=[str(source)],
            extra_cflags=list(cflags),
            extra_ldflags=list(ldflags),
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=False,
        )
    (build_dir / _DONE).write_text(f"{time.perf_counter() - start:.1f} s\n")
    logger.info("compiled %s in %.1f s", source.name, time.perf_counter() - start)
    return library


def try_load_cpu_op_library(
    name: str,
    source: Path,
    what: str,
    required_cpu_flags: Sequence[str] = (),
    cflags: Sequence[str] = CPU_CFLAGS,
    *,
    available_flags: frozenset[str] | None = None,
    build: Callable[[str, Path, Sequence[str]], object] | None = None,
) -> bool:
    """``load_cpu_op_library`` for callers with a torch fallback: True when the ops are loaded;
    False (the reason logged: missing CPU flags at INFO, a failed build or load as a WARNING)
    when ``what`` cannot run here. ``available_flags`` (default: this CPU's) and ``build``
    (default: ``load_cpu_op_library``) let a test describe another machine."""
    flags = cpu_flags() if available_flags is None else available_flags
    missing = [f for f in required_cpu_flags if f not in flags]
    if missing:
        logger.info("%s unavailable: CPU lacks %s; using the torch path", what, ", ".join(missing))
        return False
    try:
        (build or load_cpu_op_library)(name, source, cflags)
    except Exception as exc:  # compiler missing, build error, loader error: all mean "use torch"
        lines = str(exc).strip().splitlines()
        logger.warning("%s unavailable (%s: %s); using the torch path", what, type(exc).__name__,
                       lines[-1] if lines else "")
        logger.debug("%s build failure", what, exc_info=True)
        return False
    return True


def try_load_op_variant(namespace: str, source: Path, what: str, required_cpu_flags: Sequence[str], macro: str,
                        cflags: Sequence[str]) -> bool:
    """``try_load_cpu_op_library`` for a second build of ``source`` in the same process: its ops under
    ``namespace`` (the source names its library ``macro``, defined here), compiled with ``cflags`` added
    to the usual ones (``-mno-avx512f``: the AVX2 code on an AVX-512 CPU, for its tests)."""
    flags = (*CPU_CFLAGS, *cflags, f"-D{macro}={namespace}")
    return try_load_cpu_op_library(namespace, source, f"{what} ({namespace})", required_cpu_flags, flags)
