"""The Batch API against the real server: the openai SDK's files and batches flow, results equal
to direct calls, bad lines in the error file, every bad request to the endpoints a clear status
in OpenAI's envelope, and privacy between API keys."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest

from swiftlm.config import ServerConfig

KEY = "sk-batch-test"


@pytest.fixture(scope="module")
def server(start_server, tiny_tied_dir):
    return start_server(tiny_tied_dir, ServerConfig(api_key=KEY, max_batch_file_bytes=200_000), max_num_seqs=8)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key=KEY, max_retries=0)


def chat_body(server, i: int, max_tokens: int = 8) -> dict[str, Any]:
    return {"model": server.model, "messages": [{"role": "user", "content": f"question {i}"}],
            "max_tokens": max_tokens, "temperature": 0, "enable_thinking": False}


def jsonl(lines: list[Any]) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


def wait_done(client: openai.OpenAI, batch_id: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.1)


def read_lines(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_sdk_flow_results_equal_direct_calls(server, client) -> None:
    bodies = [chat_body(server, i) for i in range(6)]
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": b}
             for i, b in enumerate(bodies)]
    upload = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    assert upload.purpose == "batch" and upload.bytes == len(jsonl(lines))
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"job": "one"})
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"job": "one"}
    done = wait_done(client, batch.id)
    assert done.status == "completed"
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (6, 6, 0)
    assert done.error_file_id is None
    results = {r["custom_id"]: r for r in read_lines(client, done.output_file_id)}
    assert sorted(results) == [f"c{i}" for i in range(6)]
    for i, body in enumerate(bodies):
        direct = client.chat.completions.create(**{k: v for k, v in body.items() if k != "enable_thinking"},
                                                extra_body={"enable_thinking": False})
        line = results[f"c{i}"]
        assert line["error"] is None and line["response"]["status_code"] == 200
        assert line["response"]["body"]["choices"][0]["message"]["content"] == direct.choices[0].message.content
        assert line["id"].startswith("batch_req_")
    listed = client.batches.list(limit=5)
    assert batch.id in [b.id for b in listed.data]
    server.assert_no_leaks()


def test_completions_endpoint(server, client) -> None:
    lines = [{"custom_id": f"p{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": server.model, "prompt": f"once {i}", "max_tokens": 5, "temperature": 0}}
             for i in range(3)]
    upload = client.files.create(file=("p.jsonl", jsonl(lines)), purpose="batch")
    done = wait_done(client, client.batches.create(input_file_id=upload.id, endpoint="/v1/completions",
                                                   completion_window="24h").id)
    results = read_lines(client, done.output_file_id)
    for line in results:
        direct = client.completions.create(**lines[int(line["custom_id"][1:])]["body"])
        assert line["response"]["body"]["choices"][0]["text"] == direct.choices[0].text


def test_bad_lines_go_to_the_error_file_and_the_rest_runs(server, client) -> None:
    good = {"custom_id": "ok", "method": "POST", "url": "/v1/chat/completions", "body": chat_body(server, 0)}
    lines = [
        good,
        "{not json",  # 1. not JSON
        {"custom_id": "url", "method": "POST", "url": "/v1/embeddings", "body": chat_body(server, 1)},  # 2. wrong url
        {"custom_id": "body", "method": "POST", "url": "/v1/chat/completions", "body": {"model": server.model}},  # 3.
        {"custom_id": "ok", "method": "POST", "url": "/v1/chat/completions", "body": chat_body(server, 2)},  # 4. dup
        {"custom_id": "get", "method": "GET", "url": "/v1/chat/completions", "body": chat_body(server, 3)},  # 5.
        {"custom_id": "ok2", "method": "POST", "url": "/v1/chat/completions", "body": chat_body(server, 4)},
    ]
    upload = client.files.create(file=("bad.jsonl", jsonl(lines)), purpose="batch")
    done = wait_done(client, client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                                   completion_window="24h").id)
    assert done.status == "completed"
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (7, 2, 5)
    assert sorted(r["custom_id"] for r in read_lines(client, done.output_file_id)) == ["ok", "ok2"]
    errors = read_lines(client, done.error_file_id)
    codes = sorted((r["error"] or {}).get("code") or str(r["response"]["status_code"]) for r in errors)
    assert codes == sorted(["invalid_json_line", "mismatched_endpoint", "400", "duplicate_custom_id", "invalid_method"])
    bad_body = next(r for r in errors if r["custom_id"] == "body")
    assert bad_body["response"]["body"]["error"]["type"] == "invalid_request_error"  # the endpoint's own 400


def test_bad_requests_get_their_status_and_the_envelope(server, client) -> None:
    def post(path: str, **kwargs: Any) -> httpx.Response:
        return httpx.post(server.v1 + path, headers={"Authorization": f"Bearer {KEY}"}, timeout=30, **kwargs)

    def check(r: httpx.Response, status: int, words: str) -> None:
        assert r.status_code == status, r.text
        assert words in r.json()["error"]["message"] and r.json()["error"]["type"]

    check(post("/batches", json={"input_file_id": "file-nope", "endpoint": "/v1/chat/completions",
                                 "completion_window": "24h"}), 404, "file-nope")
    check(httpx.get(server.v1 + "/batches/batch_nope", headers={"Authorization": f"Bearer {KEY}"}), 404, "batch_nope")
    check(post("/batches/batch_nope/cancel"), 404, "batch_nope")
    check(httpx.get(server.v1 + "/files/file-nope/content", headers={"Authorization": f"Bearer {KEY}"}), 404,
          "file-nope")
    other = client.files.create(file=("x.txt", b"hello"), purpose="user_data")
    check(post("/batches", json={"input_file_id": other.id, "endpoint": "/v1/chat/completions",
                                 "completion_window": "24h"}), 400, "purpose")
    good = client.files.create(file=("in.jsonl", jsonl([{"custom_id": "a", "url": "/v1/chat/completions",
                                                         "method": "POST", "body": chat_body(server, 0)}])),
                               purpose="batch")
    check(post("/batches", json={"input_file_id": good.id, "endpoint": "/v1/embeddings",
                                 "completion_window": "24h"}), 400, "endpoint")
    check(post("/batches", json={"input_file_id": good.id, "endpoint": "/v1/chat/completions",
                                 "completion_window": "1h"}), 400, "completion_window")
    check(post("/files", files={"file": ("big.jsonl", b"x" * 200_001)}, data={"purpose": "batch"}), 413, "200000")
    check(post("/files", files={"file": ("a.jsonl", b"{}")}, data={"purpose": "nonsense"}), 400, "purpose")
    check(post("/batches", json={"input": []}), 400, "input")
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("file-nope")
    assert httpx.get(server.base_url + "/health").status_code == 200  # still serving


def test_jobs_and_files_are_private_to_their_key(server, client) -> None:
    upload = client.files.create(file=("in.jsonl", jsonl([{"custom_id": "a", "url": "/v1/chat/completions",
                                                           "method": "POST", "body": chat_body(server, 0)}])),
                                 purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_done(client, batch.id)
    # the server has one key: a request without it is a 401, never another owner's data
    assert httpx.get(server.v1 + f"/files/{upload.id}").status_code == 401
    assert httpx.get(server.v1 + f"/batches/{batch.id}").status_code == 401
    assert client.files.delete(upload.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(upload.id)


def test_cancel_keeps_the_results_it_had(server, client) -> None:
    # 8 short lines, then 32 that cannot all end during the test: 4000 tokens each (the context
    # window), at most 4 lines at once (the background share of 8 seats), so the job needs 8 rounds of
    # 4000 steps; the lines run first come, first served, so the short ones finish first
    short = [f"k{i}" for i in range(8)]
    lines = [{"custom_id": f"k{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": chat_body(server, i, max_tokens=8) if i < 8 else
              {**chat_body(server, i, max_tokens=4000), "ignore_eos": True}} for i in range(40)]
    upload = client.files.create(file=("many.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 60
    while client.batches.retrieve(batch.id).request_counts.completed < 2:
        assert time.monotonic() < deadline, "the short lines did not finish"
        time.sleep(0.05)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled"), f"the job was {cancelling.status} before the cancel"
    done = wait_done(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    results = read_lines(client, done.output_file_id)
    assert 2 <= len(results) < 40 and len(results) == done.request_counts.completed
    assert len({r["custom_id"] for r in results}) == len(results)
    assert {r["custom_id"] for r in results} <= set(short)  # the long lines were aborted, not finished
    server.assert_no_leaks()  # the aborted lines freed their blocks


def test_metrics_count_batch_lines(server) -> None:
    text = httpx.get(server.base_url + "/metrics").text
    assert "swiftlm:batch_lines_done_total" in text and "swiftlm:batch_lines_running" in text


def test_disabled_batch_api_is_a_404(start_server, tiny_tied_dir) -> None:
    off = start_server(tiny_tied_dir, ServerConfig(enable_batch_api=False))
    r = httpx.post(off.v1 + "/batches", json={"input": [{"custom_id": "a"}]}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(off.v1 + "/files", timeout=30).status_code == 404


def test_without_a_server_key_each_bearer_token_is_its_own_owner(start_server, tiny_tied_dir) -> None:
    open_server = start_server(tiny_tied_dir)
    alice = openai.OpenAI(base_url=open_server.v1, api_key="alice", max_retries=0)
    bob = openai.OpenAI(base_url=open_server.v1, api_key="bob", max_retries=0)
    line = {"custom_id": "a", "url": "/v1/chat/completions", "method": "POST", "body": chat_body(open_server, 0)}
    upload = alice.files.create(file=("in.jsonl", jsonl([line])), purpose="batch")
    batch = alice.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    for call in (lambda: bob.files.retrieve(upload.id), lambda: bob.batches.retrieve(batch.id),
                 lambda: bob.files.content(upload.id), lambda: bob.batches.cancel(batch.id),
                 lambda: bob.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                            completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            call()
    assert upload.id not in [f.id for f in bob.files.list()] and not bob.batches.list().data
    assert wait_done(alice, batch.id).status == "completed"


def test_a_storage_dir_serves_one_process_at_a_time(tmp_path) -> None:
    from swiftlm.server.batch.api import BatchApi, StorageInUseError, default_storage_dir

    async def call(url, body, owner):
        return 200, {}

    first = BatchApi.open(str(tmp_path), 8000, call, 1000, None, 4)
    with pytest.raises(StorageInUseError, match="--batch-storage-dir"):
        BatchApi.open(str(tmp_path), 8000, call, 1000, None, 4)
    import asyncio

    asyncio.run(first.close())
    asyncio.run(BatchApi.open(str(tmp_path), 8000, call, 1000, None, 4).close())  # released on close
    assert default_storage_dir(8001) != default_storage_dir(8000)
