from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from swiftlm.bench.ab import ABConfig, ServeProcess, ServerStartError, Target, parse_target, run_ab
from swiftlm.bench.compare import (
    Check,
    compare,
    evaluate_checks,
    exit_code,
    metric_value,
    parse_check,
    render_ab_markdown,
)
from tests.bench.helpers import run_of

FAKE = Path(__file__).resolve().parent / "fake_openai.py"


def test_parse_check() -> None:
    assert parse_check("p95_latency>+5%") == Check("p95_latency", ">", 0.05, "p95_latency>+5%")
    assert parse_check(" success_rate < -1% ").threshold == pytest.approx(-0.01)
    assert parse_check("avg_ttft>10.5%").metric == "mean_ttft"
    for bad in ("p95_latency>5", "p95_latency=+5%", "latency>+5%", "p42_latency>+1%"):
        with pytest.raises(ValueError):
            parse_check(bad)


def _sides(rng: np.random.Generator, scale_b: float, rounds: int = 2, n: int = 150):
    a = [run_of(list(rng.gamma(5.0, 0.2, size=n)), duration_s=10.0) for _ in range(rounds)]
    b = [
        run_of(list(rng.gamma(5.0, 0.2 * scale_b, size=n)), duration_s=10.0 * scale_b) for _ in range(rounds)
    ]
    return a, b


def test_regression_in_b_fails_and_a_vs_a_passes() -> None:
    a, b = _sides(np.random.default_rng(0), scale_b=1.3)
    checks = [parse_check("p95_latency>+5%"), parse_check("mean_ttft>+10%"), parse_check("success_rate<-1%")]
    comps = compare(a, b, ["p95_latency", "mean_ttft", "success_rate", "requests_per_s"], n_boot=300)
    results = evaluate_checks(comps, checks)
    assert [r.passed for r in results] == [False, False, True] and exit_code(results) == 1
    assert evaluate_checks(comps, checks, mode="ci")[0].passed is False
    same = evaluate_checks(compare(a, a, ["p95_latency", "mean_ttft", "success_rate"], n_boot=300), checks)
    assert all(r.passed for r in same) and exit_code(same) == 0
    md = render_ab_markdown(comps, results, {"A": "x", "B": "y"})
    assert "| p95_latency |" in md and "FAIL p95_latency>+5%" in md


def test_failures_lower_the_success_rate() -> None:
    a = [run_of([1.0] * 99, failures=["timeout"])]
    b = [run_of([1.0] * 90, failures=["http_429"] * 10)]
    (comp,) = compare(a, b, ["success_rate"], n_boot=200)
    assert comp.a == pytest.approx(0.99) and comp.b == pytest.approx(0.90)
    assert comp.change == pytest.approx(0.90 / 0.99 - 1)
    assert exit_code(evaluate_checks([comp], [parse_check("success_rate<-1%")])) == 1


def test_unmeasurable_metric_fails_its_check() -> None:
    a, b = [run_of([], failures=["connect"])], [run_of([1.0])]
    results = evaluate_checks(compare(a, b, ["p95_latency"], n_boot=50), [parse_check("p95_latency>+5%")])
    assert exit_code(results) == 1 and "could not be measured" in results[0].message


def test_bootstrap_interval_contains_the_true_change() -> None:
    rng = np.random.default_rng(42)
    # True means 1.0 and 1.1: a +10% change in mean latency; the p50 changes by the same factor.
    a = [run_of(list(rng.exponential(1.0, size=1500)))]
    b = [run_of(list(rng.exponential(1.1, size=1500)))]
    comps = {c.metric: c for c in compare(a, b, ["mean_latency", "p50_latency"], n_boot=1000, seed=1)}
    for comp in comps.values():
        assert comp.ci_low < 0.10 < comp.ci_high
        assert comp.ci_low < comp.change < comp.ci_high
    assert compare(a, b, ["mean_latency"], n_boot=1000, seed=1) == compare(
        a, b, ["mean_latency"], n_boot=1000, seed=1
    )


def test_rate_metrics_bootstrap_over_rounds() -> None:
    a, b = _sides(np.random.default_rng(3), scale_b=1.25, rounds=3)
    (comp,) = compare(a, b, ["requests_per_s"], n_boot=200)
    assert comp.a == pytest.approx(15.0) and comp.b == pytest.approx(150 / 12.5)
    assert comp.change == pytest.approx(-0.2) and comp.ci_low == pytest.approx(-0.2)
    (single,) = compare(a[:1], b[:1], ["requests_per_s"], n_boot=50)
    assert single.change == pytest.approx(-0.2) and single.ci_low is None
    assert metric_value(a, "avg_latency") == metric_value(a, "mean_latency")


def test_parse_target() -> None:
    assert parse_target("A", "http://127.0.0.1:8000") == Target("A", base_url="http://127.0.0.1:8000")
    b = parse_target("B", "Qwen/Qwen3-0.6B --max-num-seqs 8 --no-enable-prefix-caching")
    assert b.serve_args == ("Qwen/Qwen3-0.6B", "--max-num-seqs", "8", "--no-enable-prefix-caching")
    with pytest.raises(ValueError):
        parse_target("A", "  ")


def test_serve_process_starts_waits_and_stops(tmp_path) -> None:
    proc = ServeProcess(
        ["fake-model"],
        startup_timeout_s=30,
        command=(sys.executable, str(FAKE)),
        log_path=tmp_path / "serve.log",
    )
    assert proc.argv[-4:] == ["--host", "127.0.0.1", "--port", str(proc.port)]
    with proc:
        import httpx

        assert httpx.get(f"{proc.base_url}/v1/models").json()["data"][0]["id"] == "fake-model"
    assert proc.proc.returncode is not None


def test_serve_process_reports_a_failed_start(tmp_path) -> None:
    proc = ServeProcess(
        ["--bogus"],
        startup_timeout_s=10,
        command=(sys.executable, "-c", "import sys; print('no such flag'); sys.exit(2)"),
        log_path=tmp_path / "serve.log",
    )
    with pytest.raises(ServerStartError, match="exited with code 2(.|\n)*no such flag"):
        proc.start()


def test_bootstrap_interval_coverage() -> None:
    rng = np.random.default_rng(7)
    covered = 0
    for trial in range(20):
        a = [run_of(list(rng.gamma(2.0, 0.5, size=300)))]
        b = [run_of(list(rng.gamma(2.0, 0.5 * 0.9, size=300)))]  # true change of the mean: -10%
        (comp,) = compare(a, b, ["mean_latency"], n_boot=400, seed=trial)
        covered += comp.ci_low < -0.10 < comp.ci_high
    assert covered >= 16  # a 95% interval should cover ~19 of 20


def test_run_ab_starts_a_served_side_and_stops_it(fake, tmp_path) -> None:
    served = parse_target("A", "fake-model --max-num-seqs 4")
    config = ABConfig(
        rounds=2,
        concurrency=2,
        num_requests=3,
        workload="chat",
        show_progress=False,
        serve_command=(sys.executable, str(FAKE)),
        startup_timeout_s=30,
    )
    rounds_a, rounds_b = run_ab(served, parse_target("B", fake.url), config, log_dir=tmp_path)
    assert [len(r.records) for r in rounds_a + rounds_b] == [3, 3, 3, 3]
    assert all(r.ok for run in rounds_a + rounds_b for r in run.records)
    sessions = {b["session_id"] for b in fake.app.state.bodies}
    assert len(sessions) == 2 and all(s.endswith("-B") for s in sessions)  # 2 rounds x 1 conversation
    assert (tmp_path / "serve_A_round0.log").exists()


def test_run_ab_per_side_request_options(fake) -> None:
    """One server, two request settings: the reference deployment's thinking/streaming A/B."""
    config = ABConfig(
        rounds=2,
        concurrency=1,
        num_requests=2,
        workload="qa",
        show_progress=False,
        extra_body={"temperature": 0.5, "seed": 1},
        side_extra_body={"A": {"enable_thinking": True}, "B": {"enable_thinking": False, "max_tokens": 128}},
        side_stream={"A": True, "B": False},
    )
    rounds_a, rounds_b = run_ab(parse_target("A", fake.url), parse_target("B", fake.url), config)
    assert all(r.ok for run in rounds_a + rounds_b for r in run.records)
    bodies = fake.app.state.bodies
    assert len(bodies) == 8
    for i, body in enumerate(bodies):  # rounds A, B, A, B; two requests each
        side_a = (i // 2) % 2 == 0
        assert body["stream"] is side_a
        assert body["enable_thinking"] is side_a
        assert body["temperature"] == 0.5 and body["seed"] == 1
        assert body["max_tokens"] == (64 if side_a else 128)  # the qa preset's 64 unless B overrides it
