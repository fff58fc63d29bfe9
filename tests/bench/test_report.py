from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from swiftlm.bench.client import RunResult
from swiftlm.bench.plots import write_plots
from swiftlm.bench.report import describe, percentile, render_markdown, summarize, write_json, write_markdown
from tests.bench.helpers import failed_record, ok_record, run_of


def test_percentile_interpolates_linearly() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)  # pos 2.7: 3 + 0.7 * (4 - 3)
    assert percentile([5.0], 99) == 5.0
    values = list(np.random.default_rng(0).exponential(size=101))
    for q in (50, 90, 95, 99):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert describe([]) == dict.fromkeys(("avg", "min", "max", "p50", "p90", "p95", "p99"))


def test_summarize_by_hand() -> None:
    records = [
        ok_record(0, latency=1.0, ttft=0.1, tokens=10, prompt=100, cached=50, reasoning=3),
        ok_record(1, latency=2.0, ttft=0.2, tokens=19, prompt=100),
        ok_record(2, latency=3.0, ttft=0.3, tokens=1, prompt=50),  # one token: no TPOT
        ok_record(3, latency=4.0, ttft=0.4, tokens=5, prompt=50, cached=50),
        failed_record(4, "http_429", status=429),
        failed_record(5, "timeout"),
        failed_record(6, "http_429", status=429),
    ]
    s = summarize(records, duration_s=8.0)
    assert (s["num_requests"], s["num_ok"], s["num_failed"]) == (7, 4, 3)
    assert s["success_rate"] == pytest.approx(4 / 7)
    assert s["errors"] == {"http_429": 2, "timeout": 1}
    assert s["requests_per_s"] == pytest.approx(4 / 8)
    assert s["output_tokens_per_s"] == pytest.approx((10 + 19 + 1 + 5) / 8)
    assert s["total_cached_tokens"] == 100 and s["cached_token_ratio"] == pytest.approx(100 / 300)
    assert s["total_reasoning_tokens"] == 3
    lat = s["latency_s"]
    assert lat["avg"] == pytest.approx(2.5) and lat["min"] == 1.0 and lat["max"] == 4.0
    assert lat["p50"] == pytest.approx(2.5) and lat["p90"] == pytest.approx(3.7)
    assert lat["p95"] == pytest.approx(3.85) and lat["p99"] == pytest.approx(3.97)
    assert s["ttft_s"]["avg"] == pytest.approx(0.25) and s["ttft_s"]["p50"] == pytest.approx(0.25)
    tpots = [(1.0 - 0.1) / 9, (2.0 - 0.2) / 18, (4.0 - 0.4) / 4]
    assert s["tpot_s"]["avg"] == pytest.approx(sum(tpots) / 3)
    assert s["tpot_s"]["max"] == pytest.approx(0.9)
    assert s["itl_s"]["avg"] == pytest.approx((0.9 + 1.8 + 3.6) / (9 + 18 + 4))


def test_summarize_without_records_or_time() -> None:
    s = summarize([], duration_s=0.0)
    assert s["success_rate"] == 0.0 and s["requests_per_s"] == 0.0 and s["latency_s"]["p50"] is None


def _runs() -> list[RunResult]:
    rng = np.random.default_rng(1)
    return [
        run_of(
            list(rng.gamma(4.0, 0.1 * c**0.5, size=40)),
            duration_s=4.0 / c**0.5,
            concurrency=c,
            failures=["http_429"] * (c // 4),
        )
        for c in (1, 4, 16)
    ]


def test_json_markdown_and_plots_are_written(tmp_path) -> None:
    runs = _runs()
    meta = {"base_url": "http://x", "workload": "qa"}
    data = json.loads(write_json(tmp_path / "r.json", runs, meta).read_text())
    assert [r["concurrency"] for r in data["runs"]] == [1, 4, 16]
    assert len(data["runs"][2]["records"]) == 44 and data["runs"][2]["summary"]["errors"] == {"http_429": 4}
    md = write_markdown(tmp_path / "r.md", runs, meta).read_text()
    assert md == render_markdown(runs, meta)
    assert "| 16 | 44 | 90.9% | http_429 4 |" in md and "| 1 | TTFT |" in md
    paths = write_plots(runs, tmp_path)
    assert [p.name for p in paths] == [
        "latency_cdf.png",
        "ttft_vs_concurrency.png",
        "throughput_vs_concurrency.png",
    ]
    for p in paths:
        assert p.stat().st_size > 10_000
        with Image.open(p) as img:
            img.verify()
        with Image.open(p) as img:
            assert img.format == "PNG" and img.size[0] > 600


def test_plots_without_data(tmp_path) -> None:
    empty = [RunResult(2, (failed_record(0, "connect"),), 1.0)]
    for p in write_plots(empty, tmp_path):
        assert p.stat().st_size > 0
