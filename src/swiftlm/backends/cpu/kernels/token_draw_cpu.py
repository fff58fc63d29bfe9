"""A step's tokens from its logits in one CPU op (``token_draw_cpu.cpp``): greedy rows' argmax and
sampled rows' draw (temperature and min-p, inverse transform), with each row's finiteness check.

``load_token_draw()`` returns the op, ``draw_tokens(logits [B, V] float32, temperature [B],
log_min_p [B], uniform [B]) -> (ids [B] int64, finite [B] bool)``, or ``None`` when the library
cannot be built here (logged once): the caller then draws with torch
(``swiftlm.runner.sampler.sample_on_device``), which defines the math the op is tested against.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch

from swiftlm.backends.cpu.kernels.build import CPU_CFLAGS, try_load_cpu_op_library

SOURCE = Path(__file__).with_name("token_draw_cpu.cpp")
DrawTokens = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@cache
def load_token_draw() -> DrawTokens | None:
    """The compiled op (built on first use, ~15 s, then loaded from the disk cache) or None."""
    if not try_load_cpu_op_library("swiftlm_draw", SOURCE, "CPU token draw", cflags=(*CPU_CFLAGS, "-ffp-contract=off")):
        return None
    return torch.ops.swiftlm_draw.draw_tokens.default
