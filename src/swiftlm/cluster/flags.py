"""``swiftlm serve`` flags for replicas on Ray Serve (this module imports no Ray)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from swiftlm.cluster.config import ClusterConfig, default_threads_per_replica
from swiftlm.cluster.routing import ROUTING_POLICIES
from swiftlm.config import EngineConfig, ServerConfig


def _config_default(name: str) -> Any:
    """ClusterConfig's default for a field (the flags show and pass the same value)."""
    return next(f.default for f in dataclasses.fields(ClusterConfig) if f.name == name)


def add_cluster_flags(p: argparse.ArgumentParser) -> None:
    c = p.add_argument_group("replicas on Ray Serve (pip install swiftlm[ray])")
    c.add_argument("--replicas", type=int, metavar="N",
                   help="serve N engine replicas behind one ingress on a local Ray, with session and prefix "
                        "affinity (default: one process, no Ray)")
    c.add_argument("--min-replicas", type=int, metavar="N", help="autoscale on queue length from N replicas")
    c.add_argument("--max-replicas", type=int, metavar="N", help="autoscale on queue length up to N replicas")
    c.add_argument("--upscale-delay-s", type=float, metavar="S", default=_config_default("upscale_delay_s"),
                   help="autoscaling: add a replica after S seconds of sustained load above the target "
                        "(default %(default)g)")
    c.add_argument("--downscale-delay-s", type=float, metavar="S", default=_config_default("downscale_delay_s"),
                   help="autoscaling: remove a replica after S seconds of sustained load below the target "
                        "(default %(default)g)")
    c.add_argument("--threads-per-replica", type=int, metavar="N",
                   help="compute threads (and Ray CPUs) per replica (default: the machine's CPUs / replicas)")
    c.add_argument("--routing", choices=ROUTING_POLICIES, default="affinity",
                   help="affinity: a session always reaches its replica, other requests the replica that served "
                        "their prefix (default); round-robin: replicas in turn (a baseline for benchmarks)")


def cluster_config(
    args: argparse.Namespace, engine: EngineConfig, server: ServerConfig, quantization: str | None = None,
) -> ClusterConfig | None:
    """The ClusterConfig the flags ask for, or None to serve in one process."""
    if args.replicas is None and args.min_replicas is None and args.max_replicas is None:
        return None
    if quantization is not None:
        engine = dataclasses.replace(engine, quantization=quantization)
    replicas = args.replicas or args.min_replicas or 1
    fields: dict[str, Any] = {"replicas": replicas, "min_replicas": args.min_replicas, "max_replicas": args.max_replicas,
                              "routing": args.routing, "upscale_delay_s": args.upscale_delay_s,
                              "downscale_delay_s": args.downscale_delay_s}
    threads = args.threads_per_replica or default_threads_per_replica(max(replicas, args.max_replicas or 0))
    return ClusterConfig(engine=engine, server=server, threads_per_replica=threads, **fields)
