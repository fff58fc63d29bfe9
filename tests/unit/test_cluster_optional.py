"""Ray is optional: the single-process server and ``swiftlm serve`` without --replicas never import it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from swiftlm.cli import build_parser
from swiftlm.cluster.config import ClusterConfig
from swiftlm.cluster.flags import cluster_config
from swiftlm.config import ConfigError, EngineConfig, ServerConfig

NO_RAY = """
import sys
import swiftlm.server.app, swiftlm.server.launch, swiftlm.cli, swiftlm.cluster, swiftlm.cluster.routing
from swiftlm.cli import build_configs, build_parser
from swiftlm.cluster.flags import cluster_config
args = build_parser().parse_args(["serve", "some-model"])
engine, server = build_configs(args)
assert cluster_config(args, engine, server) is None
assert "ray" not in sys.modules, "the single-process path imported ray"
print("ok")
"""


def test_single_process_server_never_imports_ray() -> None:
    out = subprocess.run([sys.executable, "-c", NO_RAY], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_replica_flags() -> None:
    parser = build_parser()
    engine, server = EngineConfig(model="m"), ServerConfig()
    args = parser.parse_args(["serve", "m", "--replicas", "2", "--threads-per-replica", "1"])
    config = cluster_config(args, engine, server, "int8")
    assert isinstance(config, ClusterConfig)
    assert (config.replicas, config.threads_per_replica, config.autoscaling) == (2, 1, None)
    assert config.engine.quantization == "int8"
    args = parser.parse_args(["serve", "m", "--min-replicas", "1", "--max-replicas", "3"])
    scaled = cluster_config(args, engine, server)
    assert scaled.autoscaling == {"min_replicas": 1, "max_replicas": 3, "initial_replicas": 1,
                                  "target_ongoing_requests": 4.0, "upscale_delay_s": 30.0, "downscale_delay_s": 600.0}
    args = parser.parse_args(["serve", "m", "--min-replicas", "1", "--max-replicas", "2", "--upscale-delay-s", "5",
                              "--downscale-delay-s", "10"])
    fast = cluster_config(args, engine, server)
    assert (fast.autoscaling["upscale_delay_s"], fast.autoscaling["downscale_delay_s"]) == (5.0, 10.0)
    with pytest.raises(ConfigError, match="--downscale-delay-s must be at least 0"):
        ClusterConfig(engine=engine, min_replicas=1, max_replicas=2, downscale_delay_s=-1)
    with pytest.raises(ConfigError, match="below --min-replicas"):
        ClusterConfig(engine=engine, min_replicas=3, max_replicas=2)
    with pytest.raises(ConfigError, match="--replicas"):
        ClusterConfig(engine=engine, replicas=0)
