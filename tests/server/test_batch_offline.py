"""``swiftlm batch`` (offline, vLLM's run-batch): a 100-line file finishes with a progress bar and
the same results as the server gives for the same file; run again, it resumes from its state
directory and runs nothing twice."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from swiftlm.cli import main

LINES = 100


def _lines(model: str) -> list[dict]:
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": model, "messages": [{"role": "user", "content": f"item {i}"}], "max_tokens": 6,
                       "temperature": 0, "enable_thinking": False}} for i in range(LINES)]
    lines[7]["body"] = {"model": model}  # a bad body: the endpoint's 400, in both
    return lines


def _answers(lines: list[dict]) -> dict[str, object]:
    out = {}
    for line in lines:
        response = line["response"]
        body = response["body"]
        out[line["custom_id"]] = (response["status_code"], body["choices"][0]["message"]["content"]
                                  if response["status_code"] == 200 else body["error"]["message"])
    return out


@pytest.fixture(scope="module")
def server(start_server, tiny_tied_dir):
    return start_server(tiny_tied_dir)


def test_offline_batch_matches_the_server(server, tiny_tied_dir: Path, tmp_path: Path) -> None:
    model = str(tiny_tied_dir)
    lines = _lines(model)
    src = tmp_path / "requests.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "results.jsonl"
    cmd = [sys.executable, "-m", "swiftlm", "batch", "-i", str(src), "-o", str(out), "--model", model,
           "--dtype", "float32"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"{LINES}/{LINES}" in run.stderr  # the progress bar reached the end
    offline = [json.loads(line) for line in out.read_text().splitlines()]
    assert [x["custom_id"] for x in offline] == [x["custom_id"] for x in lines]  # input order

    batch = httpx.post(server.v1 + "/batches", json={"input": [dict(x, body=dict(x["body"], model=server.model))
                                                                for x in lines]}, timeout=30).json()
    deadline = time.monotonic() + 120
    while batch["status"] != "completed":
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)
        batch = httpx.get(f"{server.v1}/batches/{batch['id']}", timeout=10).json()
    served = []
    for key in ("output_file_id", "error_file_id"):
        text = httpx.get(f"{server.v1}/files/{batch[key]}/content", timeout=10).text
        served += [json.loads(line) for line in text.splitlines()]
    offline_answers = _answers(offline)
    served_answers = _answers(served)
    assert offline_answers.keys() == served_answers.keys()
    for custom_id, (status, text) in offline_answers.items():
        assert served_answers[custom_id][0] == status
        if status == 200:
            assert served_answers[custom_id][1] == text
    assert offline_answers["r7"][0] == 400

    # run again, it resumes: the job is complete. The same command line through the CLI's entry point,
    # in this process (the run above is the child process; a second costs ~6 s of start)
    assert main(cmd[3:]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == offline
