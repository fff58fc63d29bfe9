"""LoadConfig: how the load generator sends a workload (``bench/client.py``, ``bench/sender.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LoadConfig:
    """How to send a workload. Give `num_requests` (send that many, from the start of the
    workload) or `duration_s` (keep sending, cycling the workload, until then), or neither
    (send the whole workload once)."""

    base_url: str
    model: str | None = None
    concurrency: int = 1
    num_requests: int | None = None
    duration_s: float | None = None
    stream: bool = True
    timeout_s: float = 300.0
    connect_timeout_s: float = 10.0
    api_key: str | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    show_progress: bool = True

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.num_requests is not None and self.duration_s is not None:
            raise ValueError("give num_requests or duration_s, not both")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError(f"num_requests must be at least 1, got {self.num_requests}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"duration_s must be positive, got {self.duration_s}")
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
