"""`bench peers` (the side-by-side table) on synthetic results, and `bench hf` (the in-process
transformers baseline) on the tiny scripted checkpoint (see tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swiftlm.bench.cli import main
from swiftlm.bench.client import RequestRecord, RunResult
from swiftlm.bench.hf_baseline import HFBaseline, batches, generation_for
from swiftlm.bench.peers import load_result, render_peer_table, workload_mismatches
from swiftlm.bench.report import write_json
from swiftlm.bench.workloads import BenchRequest
from tests.bench.helpers import failed_record, ok_record
from tests.conftest import ANSWER, REASONING

META = {"workload": "random", "seed": 0, "options": {"input_len": 128}, "requests": "4 per level"}


def _run(
    concurrency: int, latencies: list[float], duration: float, tokens: int = 10, usage: bool = True
) -> RunResult:
    records = [ok_record(i, lat, 0.25 * lat, tokens) for i, lat in enumerate(latencies)]
    for r in records:
        r.usage_reported = usage
    return RunResult(concurrency, tuple(records), duration, "m")


def _write(tmp_path: Path, name: str, runs: list[RunResult], **meta: object) -> Path:
    (tmp_path / name).mkdir()
    return write_json(tmp_path / name / "results.json", runs, {**META, **meta})


@pytest.fixture()
def three(tmp_path: Path) -> list[Path]:
    fast = _write(tmp_path, "swift", [_run(1, [0.1, 0.2, 0.3, 0.4], 1.0), _run(4, [0.5] * 4, 0.5)])
    slow = _write(
        tmp_path,
        "llama",
        [_run(1, [0.2, 0.4, 0.6, 0.8], 2.0, usage=False), _run(4, [1.0] * 4, 1.0, usage=False)],
    )
    failed = RunResult(1, (ok_record(0, 1.0, 0.5), failed_record(1, "timeout")), 4.0, "m")
    hf = _write(tmp_path, "hf", [failed])  # no concurrency 4 run
    return [fast, slow, hf]


def test_table_recomputes_every_number_from_records(three: list[Path]) -> None:
    results = [load_result(p, label) for p, label in zip(three, ["swiftlm", "llama.cpp", "hf"], strict=True)]
    assert results[0].summaries[1]["output_tokens_per_s"] == pytest.approx(40.0)  # 4 x 10 tokens / 1 s
    md = render_peer_table(results)
    rows = {
        tuple(c.strip() for c in line.strip("|").split("|")[:2]): line
        for line in md.splitlines()
        if line.startswith("| ")
    }
    # concurrency 1: 40 / 20 / 2.5 output tok/s (hf: one success of two, 10 tokens in 4 s)
    assert rows[("1", "output tok/s")].endswith("| **40.0** | 20.0 | 2.5 |")
    assert rows[("1", "success rate")].endswith("| **100.0%** | **100.0%** | 50.0% |")
    # p50 latency of [0.1, 0.2, 0.3, 0.4] s is 250 ms, of [0.2 .. 0.8] s 500 ms
    assert rows[("1", "latency p50 (ms)")].endswith("| **250** | 500 | 1000 |")
    assert rows[("1", "TTFT p50 (ms)")].endswith("| **62** | 125 | 500 |")
    assert rows[("1", "output tok/s vs swiftlm")].endswith("| 1.00x | 0.50x | 0.06x |")
    assert rows[("4", "output tok/s")].endswith("| **80.0** | 40.0 | - |")
    assert rows[("4", "output tokens / request")].endswith("| 10.0 | 10.0 | - |")
    # llama.cpp's records carry no usage: its column and a footnote say so
    assert "| llama.cpp † |" in md and "† Output tokens counted from streamed chunks" in md
    assert "warning" not in md


def test_mismatched_workloads_are_named(tmp_path: Path) -> None:
    a = load_result(_write(tmp_path, "a", [_run(1, [0.1], 1.0)]), "a")
    b = load_result(_write(tmp_path, "b", [_run(1, [0.1], 1.0)], seed=7, requests="8 per level"), "b")
    warnings = workload_mismatches([a, b])
    assert len(warnings) == 2 and "seed" in warnings[0] and "requests" in warnings[1]
    assert "> warning: b differs from a in seed: 7 vs 0" in render_peer_table([a, b])


def test_peers_cli_writes_the_table(
    three: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "peers.md"
    argv = [
        "peers",
        "--results",
        *map(str, three),
        "--labels",
        "swiftlm",
        "llama.cpp",
        "hf",
        "--output",
        str(out),
    ]
    assert main(argv) == 0
    assert (
        out.read_text() in capsys.readouterr().out and "| concurrency | metric | swiftlm |" in out.read_text()
    )
    assert main(["peers", "--results", *map(str, three), "--labels", "only-one"]) == 2
    (tmp_path / "bad.json").write_text(json.dumps({"A": []}))
    assert main(["peers", "--results", str(tmp_path / "bad.json")]) == 2
    assert "not a bench serve / bench hf results.json" in capsys.readouterr().err


def test_generation_mapping_and_batches() -> None:
    chat = BenchRequest("chat", 8, messages=(("user", "hi"),), sampling={"temperature": 0.2, "top_p": 0.75})
    g = generation_for(chat, {"chat_template_kwargs": {"enable_thinking": True}, "presence_penalty": 0.5})
    assert dict(g.kwargs) == {"do_sample": True, "temperature": 0.2, "top_p": 0.75}
    assert dict(g.template) == {"enable_thinking": True} and g.ignored == ("presence_penalty",)
    g = generation_for(chat, {"temperature": 0, "top_k": -1, "stream": True})
    assert dict(g.kwargs) == {"do_sample": False, "top_k": 0, "top_p": 0.75} and g.ignored == ()
    assert dict(g.template) == {"enable_thinking": False} and not g.ignore_eos
    rand = BenchRequest("completion", 8, prompt="x", sampling={"ignore_eos": True})
    assert generation_for(rand, {}).ignore_eos
    # batches of at most 2, cut where the settings change
    reqs = [chat, chat, chat, rand, rand]
    assert [ix for ix, _ in batches(reqs, 2, {})] == [[0, 1], [2], [3, 4]]
    assert [ix for ix, _ in batches(reqs, 16, {})] == [[0, 1, 2], [3, 4]]


@pytest.fixture(scope="module")
def baseline(scripted_model_dir: Path) -> HFBaseline:
    return HFBaseline(str(scripted_model_dir), "float32", threads=2)


def _chats(n: int) -> list[BenchRequest]:
    return [
        BenchRequest("chat", 16, messages=(("user", "hi " * (i + 1)),), conversation_id=i) for i in range(n)
    ]


@pytest.mark.parametrize("concurrency", [1, 2])
def test_hf_baseline_serves_batches_and_times_them(baseline: HFBaseline, concurrency: int) -> None:
    run = baseline.run(_chats(3), concurrency, overrides={"temperature": 0})
    assert run.concurrency == concurrency and [r.index for r in run.records] == [0, 1, 2]
    for r in run.records:  # thinking off: "Hello there!" then <|im_end|>
        assert r.ok and r.usage_reported and r.completion_tokens == 4 and r.output_chars == len(ANSWER)
        assert 0 < r.ttft < r.latency and r.start + r.latency <= run.duration_s and len(r.itl) == 3
    assert run.records[0].prompt_tokens < run.records[1].prompt_tokens < run.records[2].prompt_tokens
    first, second, last = run.records
    # closed loop: a request's clock starts with its batch, which starts when the previous one ended
    # (first.start is microseconds; 0.1 s leaves a loaded machine's stalls room, far below a batch's time)
    assert first.start < 0.1 and last.start >= first.latency
    if concurrency == 2:  # requests 0 and 1 share a batch: one start, one first step, one end
        assert (second.start, second.ttft, second.latency) == (first.start, first.ttft, first.latency)


def test_hf_baseline_at_once_arrival_counts_the_queue(baseline: HFBaseline) -> None:
    run = baseline.run(_chats(3), 2, overrides={"temperature": 0}, arrival="at-once")
    first, _, last = run.records
    assert all(r.start == 0.0 for r in run.records) and last.ttft > first.latency
    # the same but for what follows its end (microseconds; a stall of a loaded machine at most), far
    # less than the batch before it, which its latency includes
    assert last.latency <= run.duration_s and last.latency == pytest.approx(run.duration_s, rel=0.05, abs=0.1)
    with pytest.raises(ValueError, match="arrival"):
        baseline.run(_chats(1), 1, arrival="poisson")


def test_hf_baseline_thinking_and_ignore_eos(baseline: HFBaseline) -> None:
    run = baseline.run(_chats(2), 2, overrides={"temperature": 0, "enable_thinking": True})
    assert all(
        r.completion_tokens == 10 and r.output_chars == len(f"<think>{REASONING}</think>\n\n{ANSWER}")
        for r in run.records
    )
    run = baseline.run(_chats(2), 2, warmup=_chats(1), overrides={"temperature": 0, "ignore_eos": True})
    assert all(r.completion_tokens == 16 and len(r.itl) == 15 for r in run.records)
    with pytest.raises(ValueError, match="earlier replies"):
        baseline.run([BenchRequest("chat", 4, messages=(("user", "x"),), session_id="s", turn=1)], 1)


def test_hf_cli_writes_serve_reports_that_peers_reads(scripted_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    argv = ["hf", "--model", str(scripted_model_dir), "--concurrency", "1,2", "--workload", "random"]
    argv += ["--input-len", "16", "--output-len", "3", "--num-requests", "2", "--no-progress", "--no-plots"]
    argv += ["--extra-body", '{"temperature": 0}', "--output-dir", str(out)]
    assert main(argv) == 0
    data = json.loads((out / "results.json").read_text())
    assert [run["concurrency"] for run in data["runs"]] == [1, 2]
    records = [RequestRecord.from_dict(r) for r in data["runs"][1]["records"]]
    assert all(r.ok and r.completion_tokens == 3 for r in records)  # random: ignore_eos, 3 tokens
    assert (out / "results.md").is_file() and data["meta"]["requests"] == "2 per level"
    assert main(["hf", "--model", str(scripted_model_dir), "--workload", "chat"]) == 2
    assert main(["peers", "--results", str(out / "results.json"), "--labels", "transformers"]) == 0
