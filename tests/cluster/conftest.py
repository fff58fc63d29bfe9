"""A local Ray cluster with 2 engine replicas of the scripted checkpoint behind the ingress.

One cluster per module (starting Ray and two replicas costs ~20 s on 2 cores); it is shut down,
with Ray, when the module ends. Ray is an optional extra: without it the modules here skip themselves.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from swiftlm.config import ServerConfig
from swiftlm.llm import engine_config
from tests.server.conftest import free_port

MODEL = "swiftlm-test"


@dataclass
class RunningCluster:
    base_url: str
    app_name: str

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def replica_metrics(self, replica_id: str) -> dict[str, float]:
        """One replica's Prometheus samples, read through the ingress's debug route."""
        text = httpx.get(f"{self.base_url}/debug/replicas/{replica_id}/metrics", timeout=10).text
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name.split("{")[0]] = samples.get(name.split("{")[0], 0.0) + float(value)
        return samples

    def kill_replica(self, replica_id: str) -> None:
        """Kill a replica's process (its Ray actor), as a crash would."""
        import ray
        from ray.serve._private.common import DeploymentID
        from ray.serve.request_router import ReplicaID

        name = ReplicaID(replica_id, DeploymentID(name="EngineReplica", app_name=self.app_name)).to_full_id_str()
        ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)


@pytest.fixture(scope="module")
def cluster(scripted_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    from swiftlm.cluster import launch
    from swiftlm.cluster.config import ClusterConfig

    port = free_port()
    server = ServerConfig(
        host="127.0.0.1", port=port, served_model_names=(MODEL,), enable_debug_endpoints=True,
        batch_storage_dir=str(tmp_path_factory.mktemp("cluster-batches")), log_level="warning",
    )
    engine = engine_config(str(scripted_model_dir), "float32", "cpu", max_model_len=4096, kv_cache_memory=64 << 20)
    config = ClusterConfig(engine=engine, server=server, replicas=2, threads_per_replica=1)
    started = time.monotonic()
    try:
        launch.deploy(config, num_cpus=2, log_to_driver=False)
        print(f"cluster up in {time.monotonic() - started:.1f}s")
        yield RunningCluster(f"http://127.0.0.1:{port}", config.app_name)
    finally:
        launch.shutdown()
