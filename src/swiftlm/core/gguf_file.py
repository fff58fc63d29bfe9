"""A GGUF file (llama.cpp's format) opened for reading: its metadata and its tensor table.

The file is memory-mapped through ``gguf.GGUFReader`` (llama.cpp's own reader); tensor data is
read only when a tensor is asked for. Both the model loader and the tokenizer read the same
opened file, so a checkpoint is parsed once.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderTensor


class GGUFError(ValueError):
    """A GGUF file that cannot be read as given (truncated, corrupt, or missing what is needed)."""


class _FastArrayReader(GGUFReader):
    """``GGUFReader`` with two shortcuts for large metadata arrays (a vocabulary's tokens, merges and
    token types), which it otherwise walks one element at a time through numpy slices of an
    ``np.memmap``: 6 s for SmolLM2's 49k-token header, over 10 s for Qwen's 151k.

    1. It reads a plain ndarray view of the map (still backed by it, no copy): an ``np.memmap``
       slice runs Python-level ``__array_finalize__``.
    2. An array of scalars is one part (one numpy view), an array of strings one memoryview per
       string; ``ReaderField.contents()`` gives the same values as before."""

    @property  # type: ignore[override]
    def data(self) -> np.ndarray:
        return self._plain_data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._plain_data = value.view(np.ndarray)

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[Any], list[int], list[GGUFValueType]]:
        if raw_type != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        count_part = self._get(orig_offs + 4, np.uint64)
        if len(raw_itype) != 1 or len(count_part) != 1:
            raise ValueError(f"metadata array at offset {orig_offs} runs past the end of the file")
        item_type, count = GGUFValueType(int(raw_itype[0])), int(count_part[0])
        offs = orig_offs + 12
        types = [GGUFValueType.ARRAY, item_type]
        scalar = self.gguf_scalar_to_np.get(item_type)
        if scalar is not None:
            values = self._get(offs, scalar, count)
            if len(values) != count:
                raise ValueError(f"metadata array at offset {orig_offs} runs past the end of the file")
            return 12 + int(values.nbytes), [raw_itype, count_part, values], [2], types
        if item_type != GGUFValueType.STRING:
            return super()._get_field_parts(orig_offs, raw_type)  # arrays of arrays: the reader's own walk
        raw = memoryview(self.data)
        length = struct.Struct(">Q" if self.byte_order == "S" else "<Q").unpack_from
        parts: list[Any] = [raw_itype, count_part]
        for _ in range(count):
            if offs + 8 > len(raw):
                raise ValueError(f"metadata array at offset {orig_offs} runs past the end of the file")
            (n,) = length(raw, offs)
            parts.append(raw[offs + 8 : offs + 8 + n])
            offs += 8 + n
        if offs > len(raw):
            raise ValueError(f"metadata array at offset {orig_offs} runs past the end of the file")
        return offs - orig_offs, parts, list(range(2, 2 + count)), types


class GGUFFile:
    """Metadata (``get``) and tensors (``tensor``, ``tensor_names``) of one GGUF file."""

    def __init__(self, path: str | Path) -> None:
        """Open and parse the header (raises GGUFError for a file that is not a whole GGUF)."""
        self.path = Path(path)
        if not self.path.is_file():
            raise GGUFError(f"{self.path} is not a file")
        size = self.path.stat().st_size
        try:
            self._reader = _FastArrayReader(self.path)
        except GGUFError:
            raise
        except (ValueError, IndexError, KeyError, OverflowError) as exc:
            raise GGUFError(f"{self.path} is not a readable GGUF file (truncated or corrupt?): {exc}") from exc
        self._tensors: dict[str, ReaderTensor] = {t.name: t for t in self._reader.tensors}
        end = max((t.data_offset + int(t.n_bytes) for t in self._reader.tensors), default=0)
        if end > size:
            raise GGUFError(f"{self.path} is truncated: its tensors need {end} bytes, the file has {size}")

    @property
    def architecture(self) -> str:
        return str(self.get("general.architecture", "unknown"))

    def get(self, key: str, default: Any = None) -> Any:
        """The value of metadata ``key`` (a str, number, bool or list), or ``default``."""
        field = self._reader.fields.get(key)
        if field is None:
            return default
        return field.contents()

    def keys(self) -> list[str]:
        return list(self._reader.fields)

    def array_type(self, key: str) -> GGUFValueType | None:
        """The element type of an array field (e.g. INT32 for tokenizer.ggml.token_type)."""
        field = self._reader.fields.get(key)
        return field.types[1] if field is not None and len(field.types) > 1 else None

    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def tensor(self, name: str) -> ReaderTensor:
        """The tensor's entry: ``.data`` (a view of the map, raw blocks for quantised types),
        ``.tensor_type``, ``.shape`` (ggml's order: fastest-varying dimension first)."""
        try:
            return self._tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path} has no tensor {name}") from None
