"""Step inputs from host lists to the device: through pinned host memory, without waiting."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_device(values: Sequence[int], device: torch.device, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """``values`` as a 1-D tensor on ``device``; on CUDA staged in pinned memory and copied
    non-blocking (the copy is ordered on the stream before the kernels that read it)."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)
