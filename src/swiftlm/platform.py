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


@cache
def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


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
