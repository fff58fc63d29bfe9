"""``GemvLinear``: a bf16 linear layer that decodes with swiftlm's AVX512-BF16 GEMV kernel.

Up to ``GEMV_MAX_ROWS`` rows (decode of up to 6 sequences) go through the kernel, which streams
the weight in nn.Linear's own layout; on CPUs with AMX, one row goes through the kernel and 2 to
``AMX_MAX_ROWS`` rows (decode batches of up to 32) through the AMX kernel (``kernels/amx_linear.h``),
which reads the same tensor at about the speed of one row; more rows (prefill chunks) go to a dense matmul: oneDNN's prepacked one when the
layer holds a packed copy (``packed=True``: twice the memory and ~2 s more at load for the 0.6B
shape, ~15-30 % faster at 7-64 rows), else ``F.linear`` on the same weight. See
``kernels/bf16_linear_cpu.cpp`` for the measurements.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from swiftlm.kernels.bf16_linear_cpu import K_MULTIPLE

Gemv = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class GemvLinear(nn.Module):
    # The 112 layer linears of the 0.6B shape (bf16, 2 threads, AMX Xeon): kernel vs F.linear,
    # 1 row 40 vs 71 ms, 4 rows 52 vs 71, 6 rows 59 vs 72, 8 rows 68 vs 70, 12 rows 87 vs 72.
    GEMV_MAX_ROWS = 6
    AMX_MAX_ROWS = 32

    def __init__(self, linear: nn.Linear, gemv: Gemv, packed: bool = False, amx: Gemv | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        if weight.dtype != torch.bfloat16 or self.in_features % K_MULTIPLE:
            raise ValueError("GemvLinear needs a bfloat16 weight whose in_features is a multiple of 32")
        self.register_buffer("weight", weight.contiguous(), persistent=False)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach(), persistent=False)
        packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, 1) if packed else None
        self.register_buffer("packed_weight", packed_weight, persistent=False)
        self.gemv = gemv
        self.amx = amx
        # with AMX, 2+ rows are faster through it: 2 rows 60 vs 75 ms, 4 rows 64 vs 83 (the 112 linears)
        self.gemv_max_rows = 1 if amx is not None else self.GEMV_MAX_ROWS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        b = self._buffers  # directly: Module.__getattr__ costs ~0.5 us a buffer, ~110 calls a token
        rows = x2.shape[0]
        if rows <= self.gemv_max_rows and x2.dtype == torch.bfloat16:
            y = self.gemv(x2.contiguous(), b["weight"])
            if b["bias"] is not None:
                y.add_(b["bias"])
        elif self.amx is not None and rows <= self.AMX_MAX_ROWS and x2.dtype == torch.bfloat16:
            y = self.amx(x2.contiguous(), b["weight"])
            if b["bias"] is not None:
                y.add_(b["bias"])
        elif b["packed_weight"] is not None:
            y = torch.ops.mkldnn._linear_pointwise(x2, b["packed_weight"], b["bias"], "none", [], "")
        else:
            y = F.linear(x2, b["weight"], b["bias"])
        return y if x2 is x else y.reshape(*x.shape[:-1], self.out_features)


def use_gemv(model: nn.Module, gemv: Gemv, packed: bool = False, amx: Gemv | None = None) -> int:
    """Replace every bf16 nn.Linear the kernel can take by a GemvLinear (with the AMX kernel for
    7-32 rows when ``amx`` is given); returns how many. The tied lm_head shares the embedding's
    tensor (the kernels read nn.Linear's layout: no copy)."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if (isinstance(child, nn.Linear) and child.weight.dtype == torch.bfloat16
                    and child.in_features % K_MULTIPLE == 0):
                setattr(parent, name, GemvLinear(child, gemv, packed, amx))
                count += 1
    return count
