"""Whether the machine has the CUDA device a config names: a clear error at start if not."""

from __future__ import annotations

import torch

from swiftlm.config import ConfigError


class CudaUnavailableError(ConfigError):
    """``--device cuda[:N]`` on a machine (or a torch build) without that CUDA device."""


def require_cuda(device: str) -> torch.device:
    """The ``torch.device`` for ``device`` ("cuda" or "cuda:N"); raises CudaUnavailableError with
    what to change when this torch build or machine has no such device."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise CudaUnavailableError(f"device {device!r} is not a CUDA device; use cuda or cuda:N")
    if torch.version.cuda is None or not torch.cuda.is_available():
        build = "this torch build has no CUDA support" if torch.version.cuda is None else "no CUDA device is visible"
        raise CudaUnavailableError(
            f"--device {device}: {build} (torch {torch.__version__}); run with --device cpu, or install a CUDA "
            "build of torch on a machine with an NVIDIA GPU"
        )
    count = torch.cuda.device_count()
    index = dev.index if dev.index is not None else 0
    if index >= count:
        raise CudaUnavailableError(f"--device {device}: this machine has {count} CUDA device(s) (cuda:0 .. cuda:{count - 1})")
    return torch.device("cuda", index)
