"""The Batch API's parts in one server: the durable store, the runner, and its limits.

Made by ``create_app`` when the Batch API is on; started with the app (resuming the jobs a crash
left unfinished) and closed with it (running lines stop and resume on the next start).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from swiftlm.batch.runner import BatchLimits, BatchRunner, LineCall
from swiftlm.batch.store import BatchStore

BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
COMPLETION_WINDOWS = {"24h": 24 * 3600}


def default_storage_dir() -> Path:
    """Under the user's cache dir, next to the kernels' cache."""
    return Path.home() / ".cache" / "swiftlm" / "batches"


@dataclass
class BatchApi:
    store: BatchStore
    runner: BatchRunner
    max_file_bytes: int

    @classmethod
    def open(cls, storage_dir: str | None, call: LineCall, max_file_bytes: int, retention_hours: float | None,
             max_concurrent_lines: int) -> BatchApi:
        root = Path(storage_dir).expanduser() if storage_dir else default_storage_dir()
        store = BatchStore(root)
        limits = BatchLimits(max_concurrent_lines=max_concurrent_lines,
                             retention_s=None if retention_hours is None else retention_hours * 3600.0)
        return cls(store, BatchRunner(store, call, limits), max_file_bytes)

    async def start(self) -> None:
        await self.runner.start()

    async def close(self) -> None:
        await self.runner.close()
