"""Device backends: one per device, built once from ``EngineConfig`` and the machine.

``build_backend(config)`` picks: the CPU backend (swiftlm's kernels, per-op fallback to the
reference) for ``device="cpu"`` with ``cpu_kernels`` on; the CUDA backend (Triton attention, CUDA
graphs) for ``"cuda[:N]"``; the plain torch reference otherwise. See
``base.py`` for the interface. Nothing outside this package imports a kernel.
"""

from __future__ import annotations

from swiftlm.backends.base import Backend
from swiftlm.config import EngineConfig


def build_backend(config: EngineConfig) -> Backend:
    if config.device == "cpu" and config.cpu_kernels:
        from swiftlm.backends.cpu.backend import CpuBackend

        return CpuBackend(prepack=config.cpu_prepack, disable=config.cpu_disable_kernels)
    if config.device.startswith("cuda"):
        from swiftlm.backends.cuda.device import require_cuda

        require_cuda(config.device)  # a clear error before triton is imported
        from swiftlm.backends.cuda.backend import CudaBackend

        return CudaBackend(config.device, enforce_eager=config.enforce_eager,
                           max_num_seqs=config.scheduler.max_num_seqs, max_model_len=config.scheduler.max_model_len)
    from swiftlm.backends.torch import TorchBackend

    return TorchBackend(config.device)


__all__ = ["Backend", "build_backend"]
