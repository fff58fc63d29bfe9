"""The Qwen3 layer's elementwise steps as single CPU ops (``fused_cpu.cpp``): RMSNorm, residual add
+ RMSNorm, q/k norm + rotary, SiLU-and-multiply; and a decode step's greedy pick (argmax and a
finiteness check of the logits in one pass).

``load_fused_ops()`` returns them as a ``FusedOps``, or ``None`` when the library cannot be built
here (no compiler, failed build; logged once) so that callers keep the plain torch code of
``swiftlm.model.layers``, which is also what the tests hold these ops to. Plain C++ (the compiler
vectorises it): any x86 or Arm CPU that builds torch extensions can run it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

from swiftlm.backends.cpu.kernels.build import CPU_CFLAGS, try_load_cpu_op_library
from swiftlm.backends.fused_forward import FusedOps

SOURCE = Path(__file__).with_name("fused_cpu.cpp")


@cache
def load_fused_ops() -> FusedOps | None:
    """The compiled ops (built on first use, ~20 s, then loaded from the disk cache) or None."""
    if not try_load_cpu_op_library("swiftlm_fused", SOURCE, "fused CPU ops", cflags=(*CPU_CFLAGS, "-ffp-contract=off")):
        return None
    ops = torch.ops.swiftlm_fused
    return FusedOps(
        rms_norm=ops.rms_norm.default,
        add_rms_norm_=ops.add_rms_norm_.default,
        qk_norm_rope=ops.qk_norm_rope.default,
        silu_mul=ops.silu_mul.default,
        greedy_pick=ops.greedy_pick.default,
    )
