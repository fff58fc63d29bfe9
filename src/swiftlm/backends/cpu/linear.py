"""CPU linear layers: ``GemvLinear`` (swiftlm's bf16 kernels for decode rows) and ``PackedLinear``
(oneDNN's prepacked matmul). Rows that reach oneDNN are padded to a few buckets (``row_buckets.py``).

``GemvLinear`` sends up to ``limits.gemv`` rows (decode of a few sequences) through the AVX512-BF16
GEMV kernel, which streams the weight in nn.Linear's own layout; on CPUs with AMX, ``limits.gemv``
is 1 and 2 to ``limits.amx`` rows (decode batches) go through the AMX kernel
(``kernels/amx_linear.h``), which reads the same tensor at about the speed of one row; more rows
(prefill chunks) go to swiftlm's bf16 GEMM on AVX-512 CPUs without AMX (``kernels/bf16_gemm.h``,
the same tensor again), else to a dense matmul: oneDNN's prepacked one when the layer holds a packed copy
(``packed=True``: twice the memory and ~2 s more at load for the 0.6B shape, ~15-30 % faster at
7-64 rows), else ``F.linear`` on the same weight. The limits and their measurements are in
``limits.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from swiftlm.backends.cpu.kernels.bf16_linear_cpu import supports as gemv_supports
from swiftlm.backends.cpu.limits import GEMV_ROWS_WITHOUT_DENSE_BF16, RowLimits
from swiftlm.backends.row_buckets import bucketed
from swiftlm.platform import cpu_flags

Gemv = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class GemvLinear(nn.Module):
    def __init__(
        self, linear: nn.Linear, gemv: Gemv, limits: RowLimits, packed: bool = False, amx: Gemv | None = None,
        gemm: Gemv | None = None, gemm_min_rows: int = 1,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        reason = gemv_supports(weight.dtype, self.in_features)
        if reason is not None:
            raise ValueError(f"GemvLinear: {reason}")
        self.register_buffer("weight", weight.contiguous(), persistent=False)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach(), persistent=False)
        if packed and not can_pack(weight.dtype):
            raise ValueError(f"GemvLinear: oneDNN cannot pack {weight.dtype} weights on this CPU")
        packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, 1) if packed else None
        self.register_buffer("packed_weight", packed_weight, persistent=False)
        self.gemv = gemv
        self.amx = amx if limits.amx else None
        self.gemv_max_rows = limits.gemv
        self.amx_max_rows = limits.amx if self.amx is not None else 0
        self.gemm = gemm if limits.gemm else None  # the row counts above the GEMV's, from gemm_min_rows
        self.gemm_min_rows = gemm_min_rows

    @property
    def builds_primitives(self) -> bool:
        """Whether some row counts reach oneDNN, whose per-shape primitives the warm-up builds at start
        (``row_buckets.warm_row_buckets``); not where swiftlm's kernels take every row count."""
        if self.gemm is not None:
            return self.gemm_min_rows > max(self.gemv_max_rows, self.amx_max_rows) + 1
        return self.gemv_max_rows < GEMV_ROWS_WITHOUT_DENSE_BF16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        b = self._buffers  # directly: Module.__getattr__ costs ~0.5 us a buffer, ~110 calls a token
        rows = x2.shape[0]
        kernel = None  # swiftlm's kernel for this many bf16 rows: GEMV, then AMX, then the GEMM
        if x2.dtype == torch.bfloat16:
            if rows <= self.gemv_max_rows:
                kernel = self.gemv
            elif rows <= self.amx_max_rows:
                kernel = self.amx
            elif rows >= self.gemm_min_rows:
                kernel = self.gemm
        if kernel is not None:
            y = kernel(x2.contiguous(), b["weight"])
            if b["bias"] is not None:
                y.add_(b["bias"])
        elif b["packed_weight"] is not None:  # oneDNN: rows in buckets (see row_buckets.py)
            y = bucketed(x2, lambda x: torch.ops.mkldnn._linear_pointwise(x, b["packed_weight"], b["bias"], "none", [],
                                                                         ""))
        else:
            y = bucketed(x2, lambda x: F.linear(x, b["weight"], b["bias"]))
        return y if x2 is x else y.reshape(*x.shape[:-1], self.out_features)


def use_gemv(
    model: nn.Module, gemv: Gemv, limits: RowLimits, packed: bool = False, amx: Gemv | None = None,
    gemm: Gemv | None = None, gemm_min_rows: int = 1,
) -> tuple[int, list[str]]:
    """Replace every nn.Linear the GEMV kernel supports by a GemvLinear (with the AMX kernel for
    its rows when ``amx`` is given, the bf16 GEMM for the rows above when ``gemm`` is). Returns how many, and the linears left as they are with the
    reason. The tied lm_head shares the embedding's tensor (the kernels read nn.Linear's layout:
    no copy)."""
    count = 0
    left: list[str] = []
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            reason = gemv_supports(child.weight.dtype, child.in_features)
            if reason is None:
                setattr(parent, name, GemvLinear(child, gemv, limits, packed, amx, gemm, gemm_min_rows))
                count += 1
            else:
                left.append(f"{parent_name}.{name}: {reason}" if parent_name else f"{name}: {reason}")
    return count, left


class PackedLinear(nn.Module):
    """A linear layer whose weight oneDNN has reordered once into its blocked layout."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, 1), persistent=False)
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.nbytes = weight.numel() * weight.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = bucketed(x.reshape(-1, shape[-1]),  # rows in buckets: oneDNN caches a primitive per shape
                     lambda x2: torch.ops.mkldnn._linear_pointwise(x2, self.packed_weight, self.bias, "none", [], ""))
        return y.reshape(*shape[:-1], self.out_features)


def can_pack(dtype: torch.dtype) -> bool:
    """oneDNN can lay out weights of ``dtype`` for its matmul on this CPU: float32 wherever oneDNN is
    built in; bfloat16 only where oneDNN has a bf16 path (AVX-512 BW/VL/DQ or AVX-NE-CONVERT: on an
    AVX2-only CPU packing a bf16 weight raises)."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        flags = cpu_flags()  # torch asks the hardware; these follow SWIFTLM_CPU_ISA too
        return ("avx512bw" in flags or "avx_ne_convert" in flags) and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


def pack_linears(model: nn.Module) -> int:
    """Replace every nn.Linear by a PackedLinear; returns how many were packed. The tied
    lm_head gets its own packed copy while the embedding keeps the plain table for lookups."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, PackedLinear(child))
                count += 1
    return count
