"""Faults injected through the runner's test hook: a step that raises fails only its step's
requests (a 500 saying the engine failed; a streaming request gets an SSE error event, then
[DONE]); a NaN logit row fails only its own request; the next requests succeed, no block leaks,
and the failures are counted. An out-of-memory step makes /health answer 503."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import torch


@pytest.fixture
def server(start_server, tiny_tied_dir):
    s = start_server(tiny_tied_dir, max_num_seqs=8)
    yield s
    s.run_in_engine(lambda e: setattr(e.runner, "fault_hook", None))


def _body(server, **fields) -> dict:
    return {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "temperature": 0, "enable_thinking": False, "ignore_eos": True, **fields}


def _chat(server, **fields) -> httpx.Response:
    return httpx.post(server.v1 + "/chat/completions", json=_body(server, **fields), timeout=60)


def _metric(server, name: str) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


class Once:
    """A fault hook that acts once, at ``stage``, when ``when(value)`` holds."""

    def __init__(self, stage: str, act, when=lambda value: True) -> None:
        self.stage, self.act, self.when, self.fired = stage, act, when, threading.Event()

    def __call__(self, stage: str, value) -> None:
        if stage == self.stage and not self.fired.is_set() and self.when(value):
            self.fired.set()
            self.act(value)


def _raise(error: BaseException):
    def act(_value) -> None:
        raise error
    return act


def test_a_step_that_raises_fails_only_its_requests(server) -> None:
    before = _metric(server, "swiftlm:engine_failed_steps")
    server.run_in_engine(lambda e: setattr(e.runner, "fault_hook", Once("forward", _raise(RuntimeError("boom")))))
    r = _chat(server)
    assert r.status_code == 500 and "engine failed" in r.json()["error"]["message"] and "boom" in r.text
    assert _chat(server).status_code == 200  # the next request is served
    assert _metric(server, "swiftlm:engine_failed_steps") == before + 1
    server.assert_no_leaks()


def test_a_streaming_request_gets_an_error_event_then_done(start_server, tiny_long_dir) -> None:
    # a request that cannot end before the hook is in: 60000 tokens on the 64k-context model
    server = start_server(tiny_long_dir, max_num_seqs=1, max_model_len=65536)
    hook = Once("forward", _raise(RuntimeError("kernel error")))
    events = []
    with httpx.stream("POST", server.v1 + "/chat/completions", json=_body(server, stream=True, max_tokens=60000),
                      timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 2:  # streaming has begun: fail the next step
                    server.run_in_engine(lambda e: setattr(e.runner, "fault_hook", hook))
    assert hook.fired.is_set(), "the request ended before the fault hook was installed"
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])
    assert "error" in error and "kernel error" in error["error"]["message"]
    assert error["error"]["type"] == "server_error"
    assert _chat(server).status_code == 200
    server.assert_no_leaks()


def test_a_nan_row_fails_only_its_own_request(server) -> None:
    def poison_first_row(logits: torch.Tensor) -> None:
        logits[0] = float("nan")

    poison = Once("logits", poison_first_row, when=lambda logits: logits.shape[0] == 2)
    engine = server.engine

    def arrived() -> int:  # the requests the engine holds: running, waiting, being added
        return len(engine.engine.scheduler.running) + engine.num_queued()

    def hook(stage: str, value) -> None:
        # until the row is poisoned, each step waits (up to 30 s) for both requests to reach the
        # engine, so that they share steps however the two sends are timed
        if stage == "forward" and not poison.fired.is_set():
            deadline = time.monotonic() + 30
            while arrived() < 2 and time.monotonic() < deadline:
                time.sleep(0.002)
        poison(stage, value)

    server.run_in_engine(lambda e: setattr(e.runner, "fault_hook", hook))
    results: dict[int, httpx.Response] = {}

    def send(i: int) -> None:
        results[i] = _chat(server, max_tokens=30)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert poison.fired.is_set(), "the two requests never shared a step"
    statuses = sorted(r.status_code for r in results.values())
    assert statuses == [200, 500], [r.text for r in results.values()]
    failed = next(r for r in results.values() if r.status_code == 500)
    assert "non-finite logits" in failed.json()["error"]["message"]
    ok = next(r for r in results.values() if r.status_code == 200)
    assert ok.json()["usage"]["completion_tokens"] == 30  # its neighbour ran to the end
    assert _metric(server, "swiftlm:engine_failed_rows") >= 1
    server.assert_no_leaks()


def test_out_of_memory_makes_health_503(start_server, tiny_tied_dir) -> None:
    s = start_server(tiny_tied_dir)
    assert httpx.get(s.base_url + "/health").status_code == 200
    s.run_in_engine(lambda e: setattr(e.runner, "fault_hook", Once("forward", _raise(MemoryError("no memory")))))
    assert _chat(s).status_code == 500
    deadline = time.monotonic() + 30
    while httpx.get(s.base_url + "/health", timeout=30).status_code != 503:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert "no memory" in httpx.get(s.base_url + "/health").json()["error"]
    assert _chat(s).status_code == 503  # new requests: 503 until the process is restarted
