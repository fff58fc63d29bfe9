"""``swiftlm serve MODEL --replicas 2`` as users run it: serves, keeps sessions, stops on SIGTERM.

Slow (a second Ray start, ~30 s): the in-process cluster of test_cluster.py covers the same
replicas and routing in CI.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.server.conftest import ANSWER, free_port

pytest.importorskip("ray.serve", reason="the cluster needs the ray extra (pip install swiftlm[ray])")


@pytest.mark.slow
def test_serve_with_replicas_until_sigterm(scripted_model_dir, tmp_path) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "swiftlm", "serve", str(scripted_model_dir), "--replicas", "2", "--port", str(port),
           "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "1024",
           "--batch-storage-dir", str(tmp_path / "batches"), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"serve exited with {proc.returncode}"
            assert time.monotonic() < deadline, "the cluster did not come up"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        messages = [{"role": "user", "content": "hi"}]
        replicas, cached = set(), []
        for _ in range(2):
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", headers={"x-session-id": "cli-1"},
                           json={"model": "tiny", "messages": messages, "max_tokens": 8, "enable_thinking": False},
                           timeout=30)
            assert r.status_code == 200, r.text
            replicas.add(r.headers["x-swiftlm-replica"])
            cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
            assert r.json()["choices"][0]["message"]["content"] == ANSWER
            messages += [{"role": "assistant", "content": ANSWER}, {"role": "user", "content": "more"}]
        assert len(replicas) == 1 and cached[1] > 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
