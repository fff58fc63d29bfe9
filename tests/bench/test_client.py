from __future__ import annotations

import pytest

from swiftlm.bench.ab import free_port
from swiftlm.bench.client import LoadConfig, run_load_sync
from swiftlm.bench.report import summarize
from swiftlm.bench.sender import api_root, build_body
from swiftlm.bench.workloads import WorkloadOptions, build_workload


def _run(url: str, n: int = 4, workload: str = "qa", **kw):
    options = kw.pop("options", WorkloadOptions(max_tokens=6))
    requests = build_workload(workload, kw.pop("pool", n), seed=0, options=options, session_prefix="s")
    cfg = LoadConfig(
        url,
        concurrency=kw.pop("concurrency", 2),
        num_requests=kw.pop("num_requests", n),
        show_progress=False,
        **kw,
    )
    return run_load_sync(requests, cfg)


def test_api_root_and_body() -> None:
    assert api_root("http://h:1/v1/") == api_root("http://h:1") == "http://h:1"
    request = build_workload("chat", 1, session_prefix="s")[0]
    body = build_body(
        request,
        "m",
        True,
        {"temperature": 0.0, "enable_thinking": False},
        history=[{"role": "user", "content": "hi"}],
    )
    assert body["model"] == "m" and body["session_id"] == "s-0-0" and body["temperature"] == 0.0
    assert body["stream_options"] == {"include_usage": True} and body["enable_thinking"] is False
    assert (
        body["messages"][0] == {"role": "user", "content": "hi"} and body["messages"][1]["role"] == "system"
    )
    assert "stream_options" not in build_body(request, None, False, {})


def test_streaming_records_ttft_gaps_and_usage(fake) -> None:
    run = _run(fake.url, n=4, extra_body={"enable_thinking": True})
    assert run.model == "fake-model" and len(run.records) == 4
    for r in run.records:
        assert r.ok and r.error is None and r.status == 200
        assert 0 < r.ttft < r.latency and len(r.itl) == 5 and all(g > 0 for g in r.itl)
        assert r.completion_tokens == 6 and r.reasoning_tokens == 2 and r.cached_tokens == 0
        assert r.usage_reported and r.prompt_tokens > 0
    body = fake.app.state.bodies[0]
    assert body["model"] == "fake-model" and body["temperature"] == 0.2 and body["top_p"] == 0.75
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_non_streaming_and_completions(fake) -> None:
    run = _run(fake.url, n=3, stream=False)
    assert all(r.ok and r.ttft is None and r.itl == [] and r.completion_tokens == 6 for r in run.records)
    random_run = _run(
        fake.url + "/v1", n=2, workload="random", options=WorkloadOptions(input_len=20, output_len=5)
    )
    assert all(r.ok and r.kind == "completion" and r.completion_tokens == 5 for r in random_run.records)
    assert fake.app.state.bodies[-1]["ignore_eos"] is True and "prompt" in fake.app.state.bodies[-1]


def test_stream_without_usage_counts_chunks(fake) -> None:
    run = _run(fake.url + "/nousage", n=2)
    assert all(r.ok and not r.usage_reported and r.completion_tokens == 6 for r in run.records)


def test_chat_turns_carry_the_real_replies(fake) -> None:
    run = _run(fake.url, n=6, workload="chat", concurrency=2, options=WorkloadOptions(turns=3, max_tokens=4))
    assert all(r.ok for r in run.records)
    bodies = sorted(fake.app.state.bodies, key=lambda b: (b["session_id"], len(b["messages"])))
    by_session: dict[str, list[dict]] = {}
    for b in bodies:
        by_session.setdefault(b["session_id"], []).append(b)
    assert sorted(by_session) == ["s-0-0", "s-0-1"]
    for turns in by_session.values():
        assert [len(b["messages"]) for b in turns] == [2, 4, 6]  # system + user, then + assistant + user
        last = turns[-1]["messages"]
        assert last[:2] == turns[0]["messages"] and last[2] == {"role": "assistant", "content": "w0 w1 w2 w3"}
        assert last[:4] == turns[1]["messages"]
    assert all(r.cached_tokens == 4 for r in run.records)


@pytest.mark.parametrize(
    ("mode", "error", "status"),
    [
        ("busy", "http_429", 429),
        ("error", "http_5xx", 500),
        ("bad", "http_4xx", 400),
        ("broken", "protocol", 200),
    ],
)
def test_http_and_protocol_errors_are_recorded(fake, mode: str, error: str, status: int) -> None:
    run = _run(f"{fake.url}/{mode}", n=3)
    assert [(r.ok, r.error, r.status) for r in run.records] == [(False, error, status)] * 3
    if mode == "busy":
        assert "Retry-After: 1" in run.records[0].error_detail
    s = summarize(run.records, run.duration_s)
    assert s["success_rate"] == 0.0 and s["errors"] == {error: 3} and s["latency_s"]["avg"] is None


def test_broken_non_streaming_json_is_a_protocol_error(fake) -> None:
    run = _run(f"{fake.url}/broken", n=1, stream=False)
    assert run.records[0].error == "protocol"


def test_timeouts_and_refused_connections(fake) -> None:
    slow = _run(f"{fake.url}/slow", n=2, timeout_s=0.3)
    assert [r.error for r in slow.records] == ["timeout", "timeout"]
    # cut off at the 0.3 s timeout, long before the answer's 5 s (the bound leaves a loaded machine room)
    assert all(0.25 < r.latency < 4.5 for r in slow.records)
    refused = _run(f"http://127.0.0.1:{free_port()}", n=3)
    assert [r.error for r in refused.records] == ["connect"] * 3 and refused.model is None


def test_success_rate_reflects_some_failures(fake) -> None:
    run = _run(f"{fake.url}/mixed", n=9, concurrency=1)
    s = summarize(run.records, run.duration_s)
    assert s["num_requests"] == 9 and s["errors"] == {"http_429": 3}
    assert s["success_rate"] == pytest.approx(6 / 9) and s["requests_per_s"] == pytest.approx(
        6 / run.duration_s
    )


def test_duration_mode_cycles_the_workload(fake) -> None:
    run = _run(fake.url, pool=3, num_requests=None, duration_s=0.4, concurrency=2)
    assert len(run.records) > 3 and all(r.ok for r in run.records)
    assert 0.4 <= run.duration_s < 5.0  # stops after 0.4 s and the requests in flight (ms each), not later
    assert [r.index for r in run.records] == list(range(len(run.records)))
