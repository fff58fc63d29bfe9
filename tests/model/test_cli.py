"""The `swiftlm` command line: generate and chat against a tiny checkpoint, serve's config mapping."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from swiftlm.cli import _TurnPrinter, build_configs, build_parser, main, parse_bytes
from swiftlm.config import CacheConfig, EngineConfig, SchedulerConfig, ServerConfig
from swiftlm.sampling import SamplingParams
from swiftlm.text.reasoning import ReasoningStreamParser

GENERATE_STATS = re.compile(
    r"load [\d.]+s \| prompt (\d+) tokens \| generated (\d+) tokens \| TTFT [\d.]+ ms \| decode [\d.]+ tok/s"
)
TURN_STATS = re.compile(r"\[prompt (\d+) tokens, cached (\d+) \| generated (\d+) tokens")


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    return subprocess.run(
        [sys.executable, "-m", "swiftlm", *args],
        input=stdin.encode() if stdin is not None else None,
        capture_output=True,
        env=env,
        timeout=120,
    )


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def test_generate_streams_the_plain_path_text(tiny_tied_dir: Path) -> None:
    from swiftlm.plain import PlainLLM

    proc = run_cli(
        "generate", "--model", str(tiny_tied_dir), "--dtype", "float32",
        "--max-tokens", "8", "--temperature", "0", "--ignore-eos", "Hello",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    expected = PlainLLM(str(tiny_tied_dir), dtype="float32").generate("Hello", greedy(8, ignore_eos=True))[0]
    assert expected.outputs[0].text.strip()
    assert proc.stdout.decode() == expected.outputs[0].text + "\n"
    stats = GENERATE_STATS.search(proc.stderr.decode())
    assert stats, proc.stderr.decode()
    assert stats.groups() == (str(len(expected.prompt_token_ids)), "8")


def test_generate_plain_flag_in_process(tiny_tied_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from swiftlm.plain import PlainLLM

    argv = ["generate", "--plain", "--model", str(tiny_tied_dir), "--dtype", "float32",
            "--max-tokens", "6", "--temperature", "0", "--ignore-eos", "The", "answer", "is"]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    expected = PlainLLM(str(tiny_tied_dir), dtype="float32").generate("The answer is", greedy(6, ignore_eos=True))[0]
    assert out == expected.outputs[0].text + "\n"
    assert GENERATE_STATS.search(err).group(2) == "6"


def test_chat_answers_each_turn_and_reuses_the_session(tiny_tied_dir: Path) -> None:
    from swiftlm.llm import LLM

    proc = run_cli(
        "chat", "--model", str(tiny_tied_dir), "--dtype", "float32", "--no-think",
        "--max-tokens", "8", "--temperature", "0",
        stdin="你好\n\n再见\n/exit\nnever sent\n",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    turns = [tuple(map(int, m)) for m in TURN_STATS.findall(proc.stderr.decode())]
    assert len(turns) == 2, proc.stderr.decode()
    (prompt1, cached1, gen1), (prompt2, cached2, _) = turns
    assert cached1 == 0
    assert cached2 >= prompt1 + gen1 - 1  # turn 2 extends turn 1's real token stream
    assert prompt2 > cached2

    # The same conversation through the Python API, in a session: the same answers.
    llm = LLM(str(tiny_tied_dir), dtype="float32", max_num_seqs=1)
    params = llm.default_sampling_params().with_updates(max_tokens=8, temperature=0.0)
    off = {"enable_thinking": False}
    messages = [{"role": "user", "content": "你好"}]
    first = llm.chat(messages, params, off, session_id="s").outputs[0].text
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "再见"}]
    second = llm.chat(messages, params, off, session_id="s").outputs[0].text
    assert proc.stdout.decode() == first + "\n" + second + "\n"


def test_chat_reset_starts_a_fresh_conversation(
    tiny_tied_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("你好\n/reset\n你好\n"))  # EOF ends
    argv = ["chat", "--model", str(tiny_tied_dir), "--dtype", "float32", "--no-think",
            "--max-tokens", "4", "--temperature", "0"]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    turns = [tuple(map(int, m)) for m in TURN_STATS.findall(err)]
    assert len(turns) == 2
    assert turns[0][0] == turns[1][0]  # the same prompt again: the history is gone
    assert "[history cleared]" in err


def test_turn_printer_shows_reasoning_apart_from_the_answer() -> None:
    out = io.StringIO()
    printer = _TurnPrinter(out)
    parser = ReasoningStreamParser(thinking=True)
    for delta in ["<think>\nLet me ", "think.\n</th", "ink>\n\nHi", " there"]:
        reasoning, content = parser.feed(delta)
        printer.reasoning(reasoning)
        printer.content(content)
    printer.finish()
    assert out.getvalue() == "[thinking] Let me think.\n\nHi there\n"


SERVE_ARGS = [
    "serve", "/models/qwen3", "--host", "0.0.0.0", "--port", "9001", "--dtype", "bfloat16",
    "--device", "cuda:1", "--max-model-len", "4096", "--block-size", "32", "--max-num-seqs", "8",
    "--max-num-batched-tokens", "1024", "--max-queued-requests", "10", "--max-queue-wait", "2.5",
    "--no-enable-prefix-caching", "--kv-cache-memory", "2GiB", "--session-ttl", "30",
    "--max-session-tokens", "5000", "--quantization", "int8", "--api-key", "sk-test",
    "--served-model-name", "qwen3-0.6b", "--default-chat-template-kwargs", '{"enable_thinking": false}',
    "--max-n", "4", "--log-level", "debug", "--no-cpu-kernels", "--cpu-prepack", "on", "--kv-cache-dtype", "fp8",
]  # fmt: skip


def test_build_configs_maps_every_serve_flag() -> None:
    args = build_parser().parse_args(SERVE_ARGS)
    engine, server = build_configs(args)
    assert engine == EngineConfig(
        model="/models/qwen3",
        dtype="bfloat16",
        device="cuda:1",
        cache=CacheConfig(
            block_size=32, kv_cache_memory=2 * 2**30, enable_prefix_caching=False, session_ttl=30.0,
            max_session_tokens=5000, kv_cache_dtype="fp8",
        ),
        scheduler=SchedulerConfig(
            max_num_seqs=8, max_num_batched_tokens=1024, max_model_len=4096, max_queued_requests=10,
            max_queue_wait=2.5,
        ),
        cpu_kernels=False,
        cpu_prepack=True,
    )  # fmt: skip
    assert server == ServerConfig(
        host="0.0.0.0", port=9001, api_key="sk-test", served_model_names=("qwen3-0.6b",),
        default_chat_template_kwargs={"enable_thinking": False}, max_n=4, log_level="debug",
    )  # fmt: skip
    assert args.quantization == "int8"


def test_build_configs_defaults_and_api_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWIFTLM_API_KEY", "from-env")
    engine, server = build_configs(build_parser().parse_args(["serve", "Qwen/Qwen3-0.6B"]))
    assert engine == EngineConfig(model="Qwen/Qwen3-0.6B")
    assert server == ServerConfig(api_key="from-env")
    monkeypatch.delenv("SWIFTLM_API_KEY")
    assert build_configs(build_parser().parse_args(["serve", "m"]))[1].api_key is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--default-chat-template-kwargs", "[1]"], "--default-chat-template-kwargs must be a JSON object"),
        (["--default-chat-template-kwargs", "{enable"], "--default-chat-template-kwargs must be a JSON object"),
        (["--block-size", "24"], "block_size must be a positive power of two"),
        (["--max-num-seqs", "0"], "max_num_seqs must be >= 1"),
    ],
)
def test_serve_config_errors_exit_2(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "some-model", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_missing_model_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--model", str(tmp_path / "missing"), "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model path") and err.count("\n") == 1


def test_parse_bytes() -> None:
    assert parse_bytes("1048576") == 2**20
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes("1.5G") == int(1.5 * 2**30)
    assert parse_bytes("2GB") == 2 * 10**9
    with pytest.raises(Exception, match="not a size"):
        parse_bytes("lots")
