"""``swiftlm serve MODEL --replicas N``: a local Ray, the replicas and the ingress, until a signal."""

from __future__ import annotations

import logging
import os
import signal
import threading

import ray
from ray import serve

from swiftlm.cluster.app import build_app
from swiftlm.cluster.config import ClusterConfig

logger = logging.getLogger("swiftlm.cluster")


def start_ray(num_cpus: int | None = None, log_to_driver: bool = True) -> None:
    """A local Ray with ``num_cpus`` (default: the machine's), unless this process is connected to one."""
    if not ray.is_initialized():
        ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, log_to_driver=log_to_driver)


def deploy(config: ClusterConfig, num_cpus: int | None = None, log_to_driver: bool = True) -> None:
    """Ray (``start_ray``), Serve's HTTP proxy on the server's host and port, and the app."""
    start_ray(num_cpus, log_to_driver)
    serve.start(http_options={"host": config.server.host, "port": config.server.port})
    serve.run(build_app(config), name=config.app_name, route_prefix="/")


def shutdown() -> None:
    """Serve's deployments, then the Ray this process started."""
    try:
        serve.shutdown()
    finally:
        ray.shutdown()


def serve_cluster(config: ClusterConfig) -> None:
    """Serve until SIGTERM/SIGINT, then take every replica and Ray down."""
    logging.basicConfig(level=config.server.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    try:
        start_ray()
        # after ray.init, which installs its own SIGTERM handler: ours shuts Serve down in order
        # (a signal while the replicas load ends the serve as soon as they are up)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        deploy(config)
        replicas = config.autoscaling or {"num_replicas": config.replicas}
        logger.info("serving %s on http://%s:%d with %s, %d threads each", config.engine.model,
                    config.server.host, config.server.port, replicas, config.threads_per_replica)
        stop.wait()
        logger.info("stopping the replicas and Ray")
    finally:
        shutdown()
