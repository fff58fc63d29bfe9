"""One engine replica: a Ray Serve deployment holding one engine and the real swiftlm app.

The ingress forwards each HTTP request here (``forward``); it runs in process against the app
``swiftlm serve`` uses (``swiftlm.server.app.create_app``), so routes, errors and streaming are
that server's own. The response comes back as a stream of parts (``swiftlm.cluster.forwarding``),
the first of which carries the replica's id in ``x-swiftlm-replica``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import AsyncIterator

from ray import serve

from swiftlm.cluster.config import ClusterConfig
from swiftlm.cluster.forwarding import ForwardedRequest, Lifespan, ResponseStart, run_in_app
from swiftlm.cluster.routing import RoutingKey

REPLICA_HEADER = "x-swiftlm-replica"

logger = logging.getLogger("swiftlm.cluster")


class EngineReplica:
    """Serve deployment class (made a deployment by ``swiftlm.cluster.app``)."""

    def __init__(self, config: ClusterConfig) -> None:
        threads = config.threads_per_replica
        # The replica's compute threads are its share of the CPUs, not bound to cores: Ray does not
        # pin replicas, so binding (OMP_PROC_BIND=close from ``swiftlm serve``'s environment) would
        # stack every replica's threads on the first cores. Set before torch loads OpenMP.
        os.environ["OMP_NUM_THREADS"] = str(threads)
        os.environ["OMP_PROC_BIND"] = "false"
        os.environ.pop("OMP_PLACES", None)
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, range(os.cpu_count() or 1))
        import torch

        torch.set_num_threads(threads)
        from swiftlm.engine.async_engine import AsyncEngine
        from swiftlm.engine.engine import Engine
        from swiftlm.server.app import create_app

        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.engine = AsyncEngine(Engine(config.engine))
        server = dataclasses.replace(config.server, batch_storage_shared=True)  # every replica's jobs, leased
        self.app = create_app(self.engine, server, config.engine.model)
        self.lifespan = Lifespan(self.app)
        self._started: asyncio.Future | None = None
        try:  # Serve builds replicas on their serving loop: start the app now (jobs resume at once)
            self._started = asyncio.get_running_loop().create_task(self.lifespan.start())
        except RuntimeError:
            pass  # no loop here: started by the first request
        logger.info("replica %s: %s loaded with %d threads", self.replica_id, config.engine.model, threads)

    async def _startup(self) -> None:
        """The app's startup hooks (the Batch API resumes its jobs), once, on the serving loop."""
        if self._started is None:
            self._started = asyncio.ensure_future(self.lifespan.start())
        await asyncio.shield(self._started)

    async def forward(self, key: RoutingKey, request: ForwardedRequest) -> AsyncIterator[ResponseStart | bytes]:
        """Run one forwarded request (``key`` is the router's; the app reads the body itself)."""
        await self._startup()
        async for part in run_in_app(self.app, request):
            if isinstance(part, ResponseStart):
                part = ResponseStart(part.status, (*part.headers, (REPLICA_HEADER.encode(), self.replica_id.encode())))
            yield part

    def check_health(self) -> None:
        """Serve's health probe: a failed engine makes the replica unhealthy, and Serve replaces it."""
        if self.engine.engine.fatal_error is not None or not self.engine.is_running:
            raise RuntimeError(f"the engine stopped: {self.engine.engine.fatal_error}")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown(drain_timeout_s=5.0)
