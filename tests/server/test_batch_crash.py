"""A Batch API job survives ``kill -9``: a 64-line job (200 lines with ``-m slow``), the server
killed with SIGKILL while it runs (once 20 lines have results: ~4 s before the end of the short job
here, 16 lines at a time), restarted on the same storage dir, completes with exactly as many
results, no custom_id twice and none missing; lines that had a result before the kill are not run
again."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.reference.conftest import ServeProcess, spawn_serve
from tests.server.conftest import free_port

KILL_AFTER = 20  # lines with a result


def _serve(model_dir: Path, storage: Path, log_dir: Path) -> ServeProcess:
    port = free_port()
    args = ["serve", str(model_dir), "--port", str(port), "--dtype", "float32", "--batch-storage-dir", str(storage),
            "--max-num-seqs", "16"]
    server = spawn_serve(args, port, log_dir)
    assert server.wait_healthy() == 200, server.log()
    return server


def _batch(server: ServeProcess, batch_id: str) -> dict:
    return httpx.get(f"{server.v1}/batches/{batch_id}", timeout=10).json()


@pytest.mark.parametrize("n_lines", [64, pytest.param(200, marks=pytest.mark.slow)])
def test_a_job_survives_sigkill_with_nothing_lost_and_nothing_twice(
    tiny_tied_dir: Path, tmp_path: Path, n_lines: int
) -> None:
    storage = tmp_path / "batches"
    lines = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": str(tiny_tied_dir), "messages": [{"role": "user", "content": f"q {i}"}],
                       "max_tokens": 24, "temperature": 0, "enable_thinking": False, "ignore_eos": True}}
             for i in range(n_lines)]
    server = _serve(tiny_tied_dir, storage, tmp_path)
    try:
        upload = httpx.post(f"{server.v1}/files", data={"purpose": "batch"}, timeout=30,
                            files={"file": ("in.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode())}).json()
        batch = httpx.post(f"{server.v1}/batches", timeout=30, json={
            "input_file_id": upload["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}).json()
        deadline = time.monotonic() + 120
        while (done_before := _batch(server, batch["id"])["request_counts"]["completed"]) < KILL_AFTER:
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(timeout=10)
    finally:
        server.wait_stopped()
    assert done_before < n_lines, "the job finished before the kill: the test did not interrupt it"

    server = _serve(tiny_tied_dir, storage, tmp_path)
    try:
        after_restart = _batch(server, batch["id"])
        assert after_restart["request_counts"]["completed"] >= done_before  # recorded results were kept
        deadline = time.monotonic() + 300
        while (state := _batch(server, batch["id"]))["status"] != "completed":
            assert state["status"] in ("in_progress", "finalizing"), state
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.1)
        assert state["request_counts"] == {"total": n_lines, "completed": n_lines, "failed": 0}
        output = httpx.get(f"{server.v1}/files/{state['output_file_id']}/content", timeout=30).text.splitlines()
        ids = [json.loads(line)["custom_id"] for line in output]
        assert len(ids) == n_lines and sorted(ids) == sorted(x["custom_id"] for x in lines)
        assert "resumed 1 unfinished batch job" in server.log()
        # every line ran to its full length: a line cut by the kill was run again from the start
        assert all(json.loads(line)["response"]["body"]["usage"]["completion_tokens"] == 24 for line in output)
    finally:
        server.terminate()
        server.wait_stopped()
