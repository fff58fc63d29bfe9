from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from PIL import Image

from swiftlm.bench.cli import add_bench_parser, main
from swiftlm.bench.client import RequestRecord
from swiftlm.bench.report import summarize
from tests.bench.conftest import TOKENIZER_GZ


def _stats(values: list[float]) -> dict[str, float]:
    v = np.array(values)
    return {
        "avg": v.mean(),
        "min": v.min(),
        "max": v.max(),
        **{f"p{q}": np.percentile(v, q) for q in (50, 90, 95, 99)},
    }


def test_add_bench_parser_registers_serve_and_ab() -> None:
    parser = argparse.ArgumentParser(prog="swiftlm")
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "bench",
            "serve",
            "--base-url",
            "http://x",
            "--concurrency",
            "1,4,16",
            "--num-requests",
            "8",
            "--no-stream",
            "--extra-body",
            "{}",
            "--seed",
            "3",
        ]
    )
    assert args.bench_command == "serve" and args.concurrency == "1,4,16" and args.stream is False
    assert callable(args.func)
    args = parser.parse_args(
        [
            "bench",
            "ab",
            "--a",
            "http://a",
            "--b",
            "model --max-num-seqs 4",
            "--fail-if",
            "p95_latency>+5%",
            "--fail-if",
            "success_rate<-1%",
            "--duration",
            "5",
        ]
    )
    assert args.fail_if == ["p95_latency>+5%", "success_rate<-1%"] and args.duration == 5.0
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "serve", "--base-url", "x", "--num-requests", "3", "--duration", "2"])


def test_bench_serve_writes_reports_that_agree_with_records(fake, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "serve",
            "--base-url",
            fake.url,
            "--workload",
            "qa",
            "--concurrency",
            "1,3",
            "--num-requests",
            "6",
            "--max-tokens",
            "5",
            "--tokenizer",
            str(TOKENIZER_GZ),
            "--output-dir",
            str(out),
            "--no-progress",
            "--extra-body",
            '{"enable_thinking": true}',
        ]
    )
    assert code == 0
    assert "## Latency (ms)" in capsys.readouterr().out
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["token_counter"] == str(TOKENIZER_GZ) and data["meta"]["model"] == "fake-model"
    assert [run["concurrency"] for run in data["runs"]] == [1, 3]
    for run in data["runs"]:
        records, s = run["records"], run["summary"]
        assert summarize([RequestRecord.from_dict(r) for r in records], s["duration_s"]) == s
        ok = [r for r in records if r["ok"]]
        assert len(records) == s["num_requests"] == 6 and s["success_rate"] == len(ok) / 6 == 1.0
        assert s["requests_per_s"] == pytest.approx(len(ok) / s["duration_s"])
        assert s["output_tokens_per_s"] == pytest.approx(
            sum(r["completion_tokens"] for r in ok) / s["duration_s"]
        )
        assert s["total_reasoning_tokens"] == 2 * 6
        for key, values in (
            ("latency_s", [r["latency"] for r in ok]),
            ("ttft_s", [r["ttft"] for r in ok]),
            ("tpot_s", [(r["latency"] - r["ttft"]) / (r["completion_tokens"] - 1) for r in ok]),
            ("itl_s", [g for r in ok for g in r["itl"]]),
        ):
            for stat, expected in _stats(values).items():
                assert s[key][stat] == pytest.approx(expected), (key, stat)
    assert "| 3 | 6 | 100.0% | - |" in (out / "results.md").read_text()
    for name in ("latency_cdf.png", "ttft_vs_concurrency.png", "throughput_vs_concurrency.png"):
        with Image.open(out / name) as img:
            assert img.format == "PNG" and img.size[0] > 600


def test_bench_serve_counts_errors_without_crashing(fake, tmp_path) -> None:
    out = tmp_path / "busy"
    assert (
        main(
            [
                "serve",
                "--base-url",
                fake.url + "/mixed",
                "--num-requests",
                "6",
                "--output-dir",
                str(out),
                "--no-progress",
                "--no-plots",
            ]
        )
        == 0
    )
    summary = json.loads((out / "results.json").read_text())["runs"][0]["summary"]
    assert summary["errors"] == {"http_429": 2} and summary["success_rate"] == pytest.approx(4 / 6)


def test_bench_ab_exit_codes(fake, tmp_path) -> None:
    common = [
        "--concurrency",
        "2",
        "--rounds",
        "2",
        "--num-requests",
        "4",
        "--max-tokens",
        "4",
        "--no-progress",
        "--bootstrap",
        "200",
    ]
    slower = main(
        [
            "ab",
            "--a",
            fake.url + "/ok",
            "--b",
            fake.url + "/lag",
            "--fail-if",
            "p50_latency>+5%",
            "--output-dir",
            str(tmp_path / "ab1"),
            *common,
        ]
    )
    assert slower == 1
    payload = json.loads((tmp_path / "ab1" / "ab.json").read_text())
    assert len(payload["A"]) == len(payload["B"]) == 2 and payload["checks"][0]["passed"] is False
    assert len(fake.app.state.bodies) == 2 * 2 * 4  # rounds x sides x requests
    assert (
        main(
            [
                "ab",
                "--a",
                fake.url + "/lag",
                "--b",
                fake.url + "/ok",
                "--fail-if",
                "p50_latency>+5%",
                "--output-dir",
                str(tmp_path / "ab2"),
                *common,
            ]
        )
        == 0
    )


def test_bench_ab_per_side_flags_reach_the_requests_and_the_report(fake, tmp_path) -> None:
    code = main([
        "ab", "--a", fake.url, "--b", fake.url, "--rounds", "1", "--num-requests", "2", "--concurrency", "1",
        "--no-progress", "--bootstrap", "50", "--extra-body", '{"seed": 3}',
        "--a-extra-body", '{"enable_thinking": true}', "--a-stream", "on",
        "--b-extra-body", '{"enable_thinking": false, "max_tokens": 128}', "--b-stream", "off",
        "--output-dir", str(tmp_path / "ab"),
    ])  # fmt: skip
    assert code == 0
    a, b = fake.app.state.bodies[:2], fake.app.state.bodies[2:]
    assert all(x["stream"] is True and x["enable_thinking"] is True and x["seed"] == 3 for x in a)
    assert all(x["stream"] is False and x["enable_thinking"] is False and x["max_tokens"] == 128 for x in b)
    meta = json.loads((tmp_path / "ab" / "ab.json").read_text())["meta"]
    assert meta["stream"] == {"A": True, "B": False}
    assert meta["extra_body"]["B"] == {"seed": 3, "enable_thinking": False, "max_tokens": 128}


def test_bad_arguments_exit_2(tmp_path, capsys) -> None:
    base = ["--output-dir", str(tmp_path), "--no-progress"]
    assert main(["serve", "--base-url", "http://127.0.0.1:9", "--extra-body", "[1]", *base]) == 2
    assert main(["serve", "--base-url", "http://127.0.0.1:9", "--concurrency", "0", *base]) == 2
    assert (
        main(["ab", "--a", "http://127.0.0.1:9", "--b", "http://127.0.0.1:9", "--fail-if", "p95>5", *base])
        == 2
    )
    assert "cannot parse --fail-if" in capsys.readouterr().err
