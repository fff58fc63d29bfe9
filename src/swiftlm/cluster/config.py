"""ClusterConfig: N engine replicas on Ray Serve behind one ingress (``swiftlm serve --replicas``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from swiftlm.cluster.routing import ROUTING_POLICIES
from swiftlm.config import ConfigError, EngineConfig, ServerConfig


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """``replicas``: how many engine replicas (fixed), unless ``min_replicas`` / ``max_replicas``
    are given: then Serve scales between them on queue length, aiming at
    ``target_ongoing_requests`` requests in flight per replica, adding a replica after
    ``upscale_delay_s`` of sustained excess and removing one after ``downscale_delay_s`` of
    sustained lack (Serve's defaults: 30 s and 600 s). ``threads_per_replica``: the
    CPUs each replica reserves from Ray and the compute threads its engine runs.
    ``max_imbalance``: how many more queued requests a prefix's replica may have than the
    least-loaded one and still get the request. ``prefix_chunk_chars``: the size of the chunks
    whose chained hashes name a request's prefix (``swiftlm.cluster.routing.prefix_keys``).
    ``routing``: "affinity" (sessions and prefixes), or "round-robin" (the benchmark's baseline)."""

    engine: EngineConfig
    server: ServerConfig = field(default_factory=ServerConfig)
    replicas: int = 2
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing_requests: float = 4.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    threads_per_replica: int = 1
    max_ongoing_requests: int = 64
    max_imbalance: int = 4
    prefix_chunk_chars: int = 256
    routing: str = "affinity"  # or "round-robin": keys ignored (the benchmark's baseline)
    app_name: str = "swiftlm"

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError(f"--replicas must be at least 1, got {self.replicas}")
        if self.routing not in ROUTING_POLICIES:
            raise ConfigError(f"--routing must be one of {', '.join(ROUTING_POLICIES)}, got {self.routing!r}")
        if self.threads_per_replica < 1:
            raise ConfigError(f"--threads-per-replica must be at least 1, got {self.threads_per_replica}")
        low, high = self.min_replicas, self.max_replicas
        if low is not None and low < 0:
            raise ConfigError(f"--min-replicas must be at least 0, got {low}")
        if low is not None and high is not None and high < low:
            raise ConfigError(f"--max-replicas {high} is below --min-replicas {low}")
        if high is not None and high < 1:
            raise ConfigError(f"--max-replicas must be at least 1, got {high}")
        for name in ("upscale_delay_s", "downscale_delay_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 0, got {getattr(self, name)}")

    @property
    def autoscaling(self) -> dict[str, Any] | None:
        """Serve's autoscaling_config, or None for a fixed number of replicas."""
        if self.min_replicas is None and self.max_replicas is None:
            return None
        low = self.min_replicas if self.min_replicas is not None else 1
        high = self.max_replicas if self.max_replicas is not None else max(low, self.replicas)
        return {
            "min_replicas": low, "max_replicas": high, "initial_replicas": min(max(self.replicas, low), high),
            "target_ongoing_requests": self.target_ongoing_requests,
            "upscale_delay_s": self.upscale_delay_s, "downscale_delay_s": self.downscale_delay_s,
        }


def default_threads_per_replica(replicas: int) -> int:
    """Each replica's share of this machine's CPUs (at least one)."""
    return max(1, (os.cpu_count() or 1) // max(1, replicas))
