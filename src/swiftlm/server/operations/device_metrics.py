"""What the server runs on, for ``/metrics``: compute threads, the backend's plan and, on CUDA,
each GPU's utilisation, memory, power and temperature read through NVML.

NVML comes from ``nvidia-ml-py`` (module ``pynvml``), imported on the first scrape of a CUDA
server only; without it (or without a driver) the GPU lines are left out and one warning is logged.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from swiftlm.engine.engine import Engine

logger = logging.getLogger("swiftlm.server")


@dataclass(frozen=True, slots=True)
class BackendPlan:
    """The backend's choices as label values of the ``swiftlm:backend`` info metric."""

    backend: str
    device: str
    dtype: str
    quantization: str
    kv_cache_dtype: str
    threads: int
    kernels: str  # the plan lines, "; "-joined
    fallbacks: str

    @classmethod
    def of(cls, engine: Engine) -> BackendPlan:
        backend, config = engine.backend, engine.config
        return cls(
            backend=backend.name, device=str(backend.device), dtype=str(engine.dtype).removeprefix("torch."),
            quantization=config.quantization or "none", kv_cache_dtype=str(config.cache.kv_cache_dtype),
            threads=torch.get_num_threads(), kernels="; ".join(backend.plan),
            fallbacks="; ".join(str(f) for f in backend.fallbacks) or "none",
        )

    def labels(self) -> dict[str, str]:
        return {name: str(getattr(self, name)) for name in self.__slots__}


class DeviceCollector(Collector):
    """``swiftlm:compute_threads`` (torch's intra-op threads, read at each scrape) and
    ``swiftlm:backend_info`` (the plan, fixed once the model is prepared)."""

    def __init__(self, plan: BackendPlan, model: str) -> None:
        self._plan = plan
        self._model = model

    def collect(self) -> Iterator:
        threads = GaugeMetricFamily("swiftlm:compute_threads", "Threads that run the model's ops.", labels=["model_name"])
        threads.add_metric([self._model], torch.get_num_threads())
        yield threads
        info = InfoMetricFamily("swiftlm:backend", "The backend's plan: kernels, threads, dtype, quantisation.")
        info.add_metric([], {"model_name": self._model, **self._plan.labels()})
        yield info


def import_pynvml() -> ModuleType:
    return importlib.import_module("pynvml")


class NvmlCollector(Collector):
    """Per-GPU lines from NVML, labelled with the NVML index and the GPU's name. ``load``
    returns the ``pynvml`` module (tests pass a fake); it runs on the first scrape. A missing
    module or a failing ``nvmlInit`` is logged once and the collector yields nothing after."""

    def __init__(self, load: Callable[[], Any] | None = None) -> None:
        self._load = load if load is not None else import_pynvml
        self._nvml: Any = None
        self._failed = False

    def _ready(self) -> Any:
        if self._nvml is None and not self._failed:
            try:
                nvml = self._load()
                nvml.nvmlInit()
                self._nvml = nvml
            except ImportError:
                self._failed = True
                logger.warning("GPU metrics are off: NVML is not installed (pip install nvidia-ml-py)")
            except Exception as exc:  # NVMLError: no driver, no permission
                self._failed = True
                logger.warning("GPU metrics are off: NVML did not start: %s", exc)
        return self._nvml

    def collect(self) -> Iterator:
        nvml = self._ready()
        if nvml is None:
            return
        labels = ["gpu", "name"]
        util = GaugeMetricFamily("swiftlm:gpu_utilization_perc", "GPU busy time over NVML's last sample period (0..1).", labels=labels)
        used = GaugeMetricFamily("swiftlm:gpu_memory_used_bytes", "GPU memory in use (all processes).", labels=labels)
        total = GaugeMetricFamily("swiftlm:gpu_memory_total_bytes", "GPU memory installed.", labels=labels)
        power = GaugeMetricFamily("swiftlm:gpu_power_watts", "GPU power draw.", labels=labels)
        temp = GaugeMetricFamily("swiftlm:gpu_temperature_celsius", "GPU core temperature.", labels=labels)
        try:
            count = nvml.nvmlDeviceGetCount()
        except Exception as exc:
            logger.debug("NVML device count failed: %s", exc)
            return
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                name = nvml.nvmlDeviceGetName(handle)
            except Exception:
                continue
            key = [str(index), name.decode() if isinstance(name, bytes) else str(name)]
            readings = (
                (util, lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0),
                (used, lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used),
                (total, lambda h: nvml.nvmlDeviceGetMemoryInfo(h).total),
                (power, lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),  # NVML reports milliwatts
                (temp, lambda h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
            )
            for family, read in readings:
                try:
                    family.add_metric(key, float(read(handle)))
                except Exception:  # NVML_ERROR_NOT_SUPPORTED on some boards: leave the line out
                    continue
        yield from (util, used, total, power, temp)
