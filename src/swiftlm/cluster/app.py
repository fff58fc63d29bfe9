"""build_app: the Serve application of N engine replicas behind one ingress.

For users with their own Ray cluster: ``serve run swiftlm.cluster:build_app model=PATH replicas=2``
(or a Serve config file naming ``import_path: swiftlm.cluster:build_app`` with those ``args``);
``swiftlm serve MODEL --replicas N`` builds the same application from its flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig

from swiftlm.cluster.config import ClusterConfig
from swiftlm.cluster.ingress import EngineIngress
from swiftlm.cluster.replica import EngineReplica
from swiftlm.cluster.router import SessionPrefixRouter

_CLUSTER_KEYS = {"replicas", "min_replicas", "max_replicas", "target_ongoing_requests", "upscale_delay_s",
                 "downscale_delay_s", "threads_per_replica", "max_ongoing_requests", "max_imbalance",
                 "prefix_chunk_chars", "routing", "app_name"}


def config_from_args(args: Mapping[str, Any]) -> ClusterConfig:
    """A ClusterConfig from ``serve run`` arguments: ``model`` (required), ``dtype``, the cluster's
    fields and any engine keyword of ``swiftlm.llm.engine_config`` (``max_model_len=4096`` ...)."""
    from swiftlm.llm import engine_config

    args = dict(args)
    if "model" not in args:
        raise ValueError("build_app needs model=PATH_OR_HUB_ID")
    cluster = {k: _number(args.pop(k)) for k in list(args) if k in _CLUSTER_KEYS}
    model, dtype = args.pop("model"), args.pop("dtype", "auto")
    engine = engine_config(model, dtype, args.pop("device", "cpu"), **{k: _number(v) for k, v in args.items()})
    return ClusterConfig(engine=engine, **cluster)


def _number(value: Any) -> Any:
    """``serve run`` passes key=value arguments as strings."""
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
    return value


def build_app(config: ClusterConfig | Mapping[str, Any]) -> serve.Application:
    if not isinstance(config, ClusterConfig):
        config = config_from_args(config)
    scaling: dict[str, Any] = {"num_replicas": config.replicas}
    if config.autoscaling is not None:
        scaling = {"autoscaling_config": config.autoscaling}
    replicas = serve.deployment(EngineReplica, name="EngineReplica").options(
        ray_actor_options={"num_cpus": config.threads_per_replica},
        max_ongoing_requests=config.max_ongoing_requests,
        health_check_period_s=2.0,
        request_router_config=RequestRouterConfig(
            request_router_class=SessionPrefixRouter,
            request_router_kwargs={"max_imbalance": config.max_imbalance, "policy": config.routing},
        ),
        **scaling,
    )
    ingress = serve.deployment(EngineIngress, name="EngineIngress").options(
        num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1024,
    )
    return ingress.bind(config, replicas.bind(config))
