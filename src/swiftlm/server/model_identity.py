"""The identity of the loaded model, for keys that must change when the weights do.

A fingerprint of what decides the model's outputs: the engine settings that change numbers (the
checkpoint as named, dtype, weight quantisation, KV cache dtype, chat template, sampling
defaults, device) and the checkpoint's files as they are on disk (name, size, modification
time of the weights, config, generation config and tokenizer files). Hashing the weights'
bytes would take seconds for a 1.2 GB checkpoint; replacing a file changes its size or mtime.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from swiftlm.engine.engine import Engine

_CHECKPOINT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".json", ".model", ".txt", ".jinja")


def checkpoint_files(directory: Path, extra: Path | None = None) -> list[tuple[str, int, int]]:
    """(name, size, mtime in ns) of the checkpoint's files in ``directory`` (and ``extra``, a
    GGUF file elsewhere), sorted by name."""
    paths = {p for p in directory.iterdir() if p.is_file() and p.suffix in _CHECKPOINT_SUFFIXES}
    if extra is not None:
        paths.add(extra)
    out = []
    for path in sorted(paths):
        stat = path.stat()
        out.append((path.name, stat.st_size, stat.st_mtime_ns))
    return out


def model_identity(engine: Engine) -> str:
    """A hex digest that changes when the weights, their quantisation or the output-relevant
    engine settings change."""
    config = engine.config
    gguf = engine.source.gguf
    parts: dict[str, Any] = {
        "model": config.model,
        "gguf_file": config.gguf_file,
        "dtype": str(engine.dtype),
        "device": config.device,
        "quantization": config.quantization,
        "kv_cache_dtype": config.cache.kv_cache_dtype,
        "chat_template": config.chat_template,
        "generation_overrides": config.generation_overrides,
        "files": checkpoint_files(engine.model_dir, gguf.path if gguf is not None else None),
    }
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()
