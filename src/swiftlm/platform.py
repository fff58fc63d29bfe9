"""What the machine offers: the default dtype and thread settings for a device."""

from __future__ import annotations

import logging
import os
from functools import cache
from pathlib import Path

import torch

logger = logging.getLogger(__name__)


def user_cache_dir() -> Path:
    """swiftlm's directory in the user's cache: ``$XDG_CACHE_HOME/swiftlm`` (``~/.cache`` by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "swiftlm"


# SWIFTLM_CPU_ISA=avx2 runs an AVX-512 CPU as an AVX2 one: the CPU flags lose AVX-512 and AMX, so every
# kernel's choice (and build: kernels/build.py adds -mno-avx512f) follows them, as on such a CPU. With
# ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2, torch's side does the same. SWIFTLM_CPU_ISA=avx512
# runs an AMX CPU as an AVX-512 one without AMX (flags and builds lose AMX; ONEDNN_MAX_CPU_ISA=
# AVX512_CORE_BF16 keeps oneDNN off its tiles too), so that an AMX machine can measure that class.
CPU_ISA_ENV = "SWIFTLM_CPU_ISA"
CPU_ISA_MASKS = {"avx2": ("avx512", "amx"), "avx512": ("amx",)}  # override -> flag prefixes it removes


def cpu_isa_override() -> str | None:
    """``avx2`` or ``avx512`` when ``$SWIFTLM_CPU_ISA`` asks to run as such a CPU; None for the CPU as it
    is (unset, empty or ``native``). Anything else is an error."""
    value = os.environ.get(CPU_ISA_ENV, "").strip().lower()
    if value in ("", "native"):
        return None
    if value not in CPU_ISA_MASKS:
        raise ValueError(f"{CPU_ISA_ENV}={value!r}: expected 'native', 'avx512' or 'avx2'")
    return value


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (``/proc/cpuinfo``), without AVX-512 and AMX under ``SWIFTLM_CPU_ISA=avx2``,
    without AMX under ``SWIFTLM_CPU_ISA=avx512``."""
    flags: frozenset[str] = frozenset()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = frozenset(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    override = cpu_isa_override()
    if override is not None:
        flags = frozenset(f for f in flags if not f.startswith(CPU_ISA_MASKS[override]))
    return flags


def cpu_has_bf16() -> bool:
    """Native bf16 dot products (AVX512-BF16 or AMX): bf16 is then faster than float32."""
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(name: str, device: str) -> str:
    """``auto`` becomes bfloat16 on GPUs and on CPUs with native bf16, float32 elsewhere."""
    if name != "auto":
        return name
    if device.startswith("cuda"):
        chosen = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    else:
        chosen = "bfloat16" if cpu_has_bf16() else "float32"
    logger.info("dtype auto -> %s on %s", chosen, device)
    return chosen
