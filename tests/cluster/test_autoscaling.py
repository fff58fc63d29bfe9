"""Autoscaling, live (slow: Serve needs some seconds of sustained load before it adds a replica,
then of quiet before it removes one): a cluster started with --min-replicas 1 --max-replicas 2
grows to 2 replicas under load, answers every request of the run, and shrinks back to 1 once the
load is gone."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import openai
import pytest

from swiftlm.config import ServerConfig
from swiftlm.llm import engine_config
from tests.cluster.conftest import MODEL
from tests.server.conftest import free_port

pytest.importorskip("ray.serve", reason="the cluster needs the ray extra (pip install swiftlm[ray])")
pytestmark = pytest.mark.slow


def _running_replicas(app_name: str) -> int:
    from ray import serve

    deployment = serve.status().applications[app_name].deployments["EngineReplica"]
    return int(deployment.replica_states.get("RUNNING", 0))


def test_min_one_max_two_grows_under_load_and_shrinks_after(scripted_model_dir: Path, tmp_path: Path) -> None:
    from swiftlm.cluster import launch
    from swiftlm.cluster.config import ClusterConfig

    port = free_port()
    server = ServerConfig(host="127.0.0.1", port=port, served_model_names=(MODEL,),
                          batch_storage_dir=str(tmp_path / "store"), log_level="warning")
    engine = engine_config(str(scripted_model_dir), "float32", "cpu", max_model_len=4096, kv_cache_memory=64 << 20)
    config = ClusterConfig(engine=engine, server=server, replicas=1, min_replicas=1, max_replicas=2,
                           target_ongoing_requests=1.0, upscale_delay_s=5.0, downscale_delay_s=10.0,
                           threads_per_replica=1)
    assert config.autoscaling == {"min_replicas": 1, "max_replicas": 2, "initial_replicas": 1,
                                  "target_ongoing_requests": 1.0, "upscale_delay_s": 5.0, "downscale_delay_s": 10.0}
    launch.deploy(config, num_cpus=2, log_to_driver=False)
    try:
        assert _running_replicas(config.app_name) == 1
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", max_retries=4, timeout=120)
        stop, answered, failed = threading.Event(), [], []

        def load(worker: int) -> None:  # 4 requests in flight at all times: 4x the target per replica
            while not stop.is_set():
                try:
                    out = client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": f"Talk, worker {worker}."}],
                        max_tokens=400, extra_body={"enable_thinking": False, "ignore_eos": True})
                    answered.append(out.usage.completion_tokens)
                except openai.APIError as exc:
                    failed.append(repr(exc))

        workers = [threading.Thread(target=load, args=(i,)) for i in range(4)]
        for t in workers:
            t.start()
        start, grown = time.monotonic(), None
        try:
            while time.monotonic() - start < 150:
                if _running_replicas(config.app_name) == 2:
                    grown = time.monotonic() - start
                    break
                time.sleep(2)
        finally:
            stop.set()
            for t in workers:
                t.join(timeout=120)
        print(f"2 replicas running {grown}s after the load started; {len(answered)} answered, {len(failed)} failed")
        assert grown is not None, "the cluster did not grow to 2 replicas under load"
        assert not any(t.is_alive() for t in workers), "a request hung"
        assert not failed and answered and all(n == 400 for n in answered)
        # no load: after the 10 s downscale delay (and Serve's metrics window) one replica goes
        quiet, shrunk = time.monotonic(), None
        while time.monotonic() - quiet < 150:
            if _running_replicas(config.app_name) == 1:
                shrunk = time.monotonic() - quiet
                break
            time.sleep(2)
        print(f"back to 1 replica {shrunk}s after the load stopped")
        assert shrunk is not None, "the cluster did not shrink back to 1 replica without load"
        after = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Still there?"}],
                                               max_tokens=8, extra_body={"enable_thinking": False})
        assert after.choices[0].message.content  # the remaining replica serves
    finally:
        launch.shutdown()
