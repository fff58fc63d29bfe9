"""The Batch API's parts in one server: the durable store, the runner, and its limits.

Made by ``create_app`` when the Batch API is on; started with the app (resuming the jobs a crash
left unfinished) and closed with it (running lines stop and resume on the next start).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

from swiftlm.batch.leases import JobLeases
from swiftlm.batch.runner import BatchLimits, BatchRunner, LineCall
from swiftlm.batch.store import BatchStore
from swiftlm.platform import user_cache_dir

BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
COMPLETION_WINDOWS = {"24h": 24 * 3600}


def default_storage_dir(port: int) -> Path:
    """Under the user's cache dir, next to the kernels' cache, one per port: servers on other
    ports keep their own jobs, and a restart on the same port resumes them."""
    return user_cache_dir() / "batches" / f"port-{port}"


class StorageInUseError(RuntimeError):
    """Another live process keeps its Batch API jobs in the same directory."""


def lock_storage(root: Path) -> int:
    """Hold an exclusive lock on ``root`` for this process's life (the OS drops it when the process
    dies, even by SIGKILL); returns the lock's file descriptor."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise StorageInUseError(
            f"the Batch API storage {root} is in use by another swiftlm process; give this one its own "
            "--batch-storage-dir (or --disable-batch-api)"
        ) from exc
    return fd


@dataclass
class BatchApi:
    store: BatchStore
    runner: BatchRunner
    max_file_bytes: int
    lock_fd: int | None  # None: the storage is shared (replicas), each job held by a lease instead
    leases: JobLeases | None = None

    @classmethod
    def open(cls, storage_dir: str | None, port: int, call: LineCall, max_file_bytes: int,
             retention_hours: float | None, max_concurrent_lines: int, shared: bool = False) -> BatchApi:
        """``shared``: other live processes (replicas) use the same storage; no process locks it,
        and each job runs in the one process holding its lease (``swiftlm.batch.leases``)."""
        root = Path(storage_dir).expanduser() if storage_dir else default_storage_dir(port)
        lock = None if shared else lock_storage(root)
        if shared:
            root.mkdir(parents=True, exist_ok=True)
        store = BatchStore(root, sweep_orphans=not shared)
        leases = JobLeases(root) if shared else None
        limits = BatchLimits(max_concurrent_lines=max_concurrent_lines,
                             retention_s=None if retention_hours is None else retention_hours * 3600.0)
        holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        runner = BatchRunner(store, call, limits, leases=leases, holder=holder)
        return cls(store, runner, max_file_bytes, lock, leases)

    async def start(self) -> None:
        await self.runner.start()

    async def close(self) -> None:
        await self.runner.close()
        self.store.close()
        if self.leases is not None:
            self.leases.close()
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # releases the lock
