"""Row counts rounded up to a few buckets before a matmul goes to oneDNN.

oneDNN builds (JIT-compiles) and caches one primitive per shape. Prefill chunks and mixed steps
come in every row count from 1 to ``max_num_batched_tokens``, so a server's primitive cache fills
with hundreds of shapes per weight: measured on this machine, ``F.linear`` of a bf16 [3072, 1024]
weight over rows 1..512 took 910 MiB more resident memory (1.8 MiB a shape), and a packed fp32
[192, 96] one 313 MiB, which a soak run saw as RSS climbing for minutes. Padding the rows to a
bucket (zero rows, results sliced off) bounds the shapes to ~30 per weight, for at most 7 extra
rows up to 64 and 63 up to 1024.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def bucket_rows(rows: int) -> int:
    """The row count a matmul of ``rows`` rows runs at: exact up to 8, then multiples of 8 up to
    64, of 64 up to 1024, of 256 beyond."""
    if rows <= 8:
        return rows
    step = 8 if rows <= 64 else 64 if rows <= 1024 else 256
    return -(-rows // step) * step


def bucketed(x2: torch.Tensor, matmul: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``matmul(x2)`` for x2 [rows, K], run on the rows padded to their bucket (then sliced back)."""
    rows = x2.shape[0]
    padded = bucket_rows(rows)
    if padded == rows:
        return matmul(x2)
    return matmul(F.pad(x2, (0, 0, 0, padded - rows)))[:rows]


def row_buckets(max_rows: int) -> list[int]:
    """Every bucket a matmul of 1 to ``max_rows`` rows runs at, ascending."""
    return sorted({bucket_rows(r) for r in range(1, max_rows + 1)})


def warm_row_buckets(model: nn.Module, max_rows: int, head_rows: int, dtype: torch.dtype) -> int:
    """Run one linear of each distinct (kind, shape, weight dtype) at every row bucket, so oneDNN
    builds its primitives (cached per shape, shared by every weight of that shape) before the first
    request rather than minutes into serving: resident memory is then flat from the start.
    ``max_rows`` bounds the rows of the layers' linears (a step's token budget), ``head_rows`` those of
    ``lm_head`` (the rows that sample). A module whose ``builds_primitives`` is False (every row count on
    swiftlm's own kernels) is left out. Returns how many matmuls ran."""
    seen: set[tuple] = set()
    runs = 0
    with torch.inference_mode():
        for name, module in model.named_modules():
            in_features = getattr(module, "in_features", None)
            weight = next(iter(module.buffers(recurse=False)), None)
            if in_features is None or weight is None or list(module.children()):
                continue
            if not getattr(module, "builds_primitives", True):
                continue
            key = (type(module), in_features, module.out_features, weight.dtype, name.endswith("lm_head"))
            if key in seen:
                continue
            seen.add(key)
            for rows in row_buckets(head_rows if key[-1] else max_rows):
                module(torch.zeros(rows, in_features, dtype=dtype, device=weight.device))
                runs += 1
    return runs
