"""``swiftlm serve`` with vLLM's flags: each one's parse and its effect on the configs, the one
log line of flags with no effect, and the errors for what swiftlm cannot honour."""

from __future__ import annotations

import dataclasses
import logging
import shlex
from pathlib import Path

import pytest

from swiftlm.cli import build_configs, build_parser, main
from swiftlm.config import CacheConfig, ConfigError, SchedulerConfig
from swiftlm.engine.engine import Engine
from swiftlm.llm import LLM
from swiftlm.server.launch import serve
from swiftlm.server.vllm_flags import check_vllm_flags, no_effect
from swiftlm.text.chat_template import ChatTemplate

# 002's `vllm serve` lines, as `swiftlm serve`: the inline `\ # comment` fragments and `...` removed
ARTICLE_LINES = [
    "Qwen/Qwen3-0.6B --enable-reasoning --reasoning-parser deepseek_r1 --max-model-len 8192 --block-size 32 "
    "--gpu-memory-utilization 0.82 --host 0.0.0.0 --port 8000",
    "Qwen/Qwen3-0.6B --disable-log-stats",
    "Qwen/Qwen3-0.6B --enable-prefix-caching --disable-log-stats false --max-model-len 8192",
    "Qwen/Qwen3-0.6B --gpu-memory-utilization 0.82 --swap-space 4 --max-num-batched-tokens 2048",
    "Qwen/Qwen3-0.6B --num-scheduler-steps 4 --max-num-seqs 128 --max-num-batched-tokens 4096",
    "Qwen/Qwen3-0.6B --max-num-seqs 64 --max-num-batched-tokens 4096 --max-queue-waiting-time 1000 --enforce-eager",
]
TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"


def parse(line: str):
    return build_parser().parse_args(["serve", *shlex.split(line)])


def configs(line: str):
    return build_configs(parse(line))


@pytest.mark.parametrize("line", ARTICLE_LINES)
def test_the_articles_command_lines_build_configs(line: str) -> None:
    engine, server = configs(line)
    assert engine.model == "Qwen/Qwen3-0.6B"


def test_the_articles_first_line_takes_effect() -> None:
    engine, server = configs(ARTICLE_LINES[0])
    assert engine.cache == CacheConfig(block_size=32, gpu_memory_utilization=0.82)
    assert engine.scheduler.max_model_len == 8192
    assert server.reasoning_parser == "deepseek_r1"
    assert (server.host, server.port) == ("0.0.0.0", 8000)


def test_max_queue_waiting_time_is_milliseconds_of_max_queue_wait() -> None:
    engine, _ = configs("m --max-queue-waiting-time 1000")
    assert engine.scheduler == SchedulerConfig(max_queue_wait=1.0)
    assert configs("m --max-queue-waiting-time 250 --max-queue-wait 0.25")[0].scheduler.max_queue_wait == 0.25
    assert configs("m --max-queue-wait 2")[0].scheduler.max_queue_wait == 2.0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("--max-queue-waiting-time 1000 --max-queue-wait 2", "--max-queue-wait 2.0 (seconds) and --max-queue-waiting-time"),
        ("--max-queue-waiting-time 0", "--max-queue-waiting-time must be positive"),
        ("--tensor-parallel-size 2", "--tensor-parallel-size 2: swiftlm runs one replica per device"),
        ("-tp 4", "--tensor-parallel-size 4: swiftlm runs one replica per device"),
        ("--pipeline-parallel-size 2", "--pipeline-parallel-size 2: swiftlm runs one replica per device"),
        ("--num-scheduler-steps 0", "--num-scheduler-steps must be >= 1"),
        ("--enable-reasoning --reasoning-parser none", "--enable-reasoning separates the reasoning"),
        ("--gpu-memory-utilization 1.2", "gpu_memory_utilization must be in (0, 1]"),
        ("--chat-template /no/such/template.jinja", "--chat-template /no/such/template.jinja: no such file"),
        ("--chat-template '{% for m in messages %}'", "the chat template does not compile"),
    ],
)
def test_values_swiftlm_cannot_honour_exit_2(flags: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "m", *shlex.split(flags)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    assert err.count("\n") == 1


def test_tensor_parallel_size_1_is_accepted() -> None:
    assert configs("m --tensor-parallel-size 1 --pipeline-parallel-size 1") == configs("m")


@pytest.mark.parametrize(("flags", "value"), [("", None), ("--disable-log-stats", True),
                                              ("--disable-log-stats true", True), ("--disable-log-stats false", False),
                                              ("--disable-log-stats False --port 9000", False)])  # fmt: skip
def test_disable_log_stats_takes_an_optional_boolean(flags: str, value: bool | None) -> None:
    assert parse(f"m {flags}").disable_log_stats is value


def test_disable_log_stats_refuses_a_non_boolean(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("m --disable-log-stats maybe")
    assert "is not a boolean" in capsys.readouterr().err


def test_reasoning_parser_reaches_the_server_config() -> None:
    for parser in ("qwen3", "deepseek_r1", "none"):
        assert configs(f"m --reasoning-parser {parser}")[1].reasoning_parser == parser
    assert configs("m")[1].reasoning_parser == "qwen3"
    assert configs("m --enable-reasoning")[1] == configs("m")[1]


def test_tool_call_parser_reaches_the_server_config() -> None:
    assert configs("m")[1].tool_call_parser == "hermes"
    assert configs("m --tool-call-parser none")[1].tool_call_parser == "none"
    assert configs("m --enable-auto-tool-choice --tool-call-parser hermes")[1] == configs("m")[1]
    with pytest.raises(ConfigError, match="--tool-call-parser none"):
        check_vllm_flags(parse("m --enable-auto-tool-choice --tool-call-parser none"))


def test_accepted_flags_leave_the_configs_as_they_are() -> None:
    accepted = ("--enable-reasoning --num-scheduler-steps 4 --disable-log-stats false --swap-space 4 "
                "--enable-batch-api --enable-auto-tool-choice --tool-call-parser hermes --trust-remote-code")
    assert configs(f"m {accepted}") == configs("m")


def test_enforce_eager_reaches_the_engine_config() -> None:
    """On CUDA it turns the decode graphs off; on a CPU nothing else changes."""
    engine, server = configs("m --enforce-eager")
    assert engine.enforce_eager and not configs("m")[0].enforce_eager
    assert (dataclasses.replace(engine, enforce_eager=False), server) == configs("m")


def test_async_scheduling_reaches_the_engine_config() -> None:
    """vLLM's --async-scheduling / --no-async-scheduling; left out, the backend decides (None)."""
    assert configs("m --async-scheduling")[0].async_scheduling is True
    assert configs("m --no-async-scheduling")[0].async_scheduling is False
    engine, server = configs("m")
    assert engine.async_scheduling is None
    assert (dataclasses.replace(configs("m --async-scheduling")[0], async_scheduling=None), server) == (engine, server)


def test_several_served_model_names() -> None:
    _, server = configs("Qwen/Qwen3-0.6B --served-model-name Qwen/Qwen3-0.6B Qwen-0.6B --port 8001")
    assert server.served_model_names == ("Qwen/Qwen3-0.6B", "Qwen-0.6B")
    assert server.port == 8001
    assert configs("m --served-model-name one")[1].served_model_names == ("one",)
    assert configs("m")[1].served_model_names == ()


# -- the no-effect log line -------------------------------------------------------------------------
ALL_UNMET = "--gpu-memory-utilization 0.82 --num-scheduler-steps 4 --disable-log-stats false --swap-space 4"
UNMET_NAMES = ["--gpu-memory-utilization", "--num-scheduler-steps", "--disable-log-stats false", "--swap-space"]


def test_no_effect_names_each_unmet_flag_with_its_reason() -> None:
    notes = no_effect(parse(f"m {ALL_UNMET}"))
    assert [note.split(" (")[0] for note in notes] == UNMET_NAMES
    assert all(note.endswith(")") for note in notes)
    assert "on a CPU the KV pool keeps its own budget" in notes[0]


def test_no_effect_leaves_out_flags_whose_request_is_what_happens() -> None:
    met = ("--enforce-eager --tensor-parallel-size 1 --num-scheduler-steps 1 --disable-log-stats --enable-reasoning "
           "--enable-auto-tool-choice --tool-call-parser hermes --trust-remote-code --swap-space 0 --max-queue-waiting-time 1000")
    assert no_effect(parse(f"m {met}")) == []
    assert no_effect(parse("m")) == []


def test_gpu_memory_utilization_takes_effect_on_cuda() -> None:
    assert no_effect(parse("m --device cuda --gpu-memory-utilization 0.82")) == []
    notes = no_effect(parse("m --device cuda:0 --gpu-memory-utilization 0.82 --kv-cache-memory 1GiB"))
    assert notes == ["--gpu-memory-utilization (--kv-cache-memory sets the KV pool)"]


def test_serve_logs_the_flags_with_no_effect_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    args = parse(f"{tmp_path / 'missing'} --port 0 --log-level warning {ALL_UNMET}")
    engine_config, server_config = build_configs(args)
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit, match="could not load the model"):
        serve(engine_config, server_config, None, no_effect=no_effect(args))  # the load fails: serve ends
    lines = [r.getMessage() for r in caplog.records if "no effect" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].startswith("flags with no effect on cpu: ")
    for name in UNMET_NAMES:
        assert name in lines[0]


# -- --chat-template ----------------------------------------------------------------------------------
def test_chat_template_file_replaces_the_models_template(tiny_tied_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "template.jinja"
    path.write_text(TEMPLATE, encoding="utf-8")
    engine_config, _ = configs(f"{tiny_tied_dir} --dtype float32 --chat-template {path}")
    assert engine_config.chat_template == TEMPLATE
    assert configs(f"m --chat-template {shlex.quote(TEMPLATE)}")[0].chat_template == TEMPLATE  # inline, as vLLM

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "你好"}]
    expected = ChatTemplate(TEMPLATE).render(messages)
    engine = Engine(dataclasses.replace(engine_config, cache=CacheConfig(num_blocks=8)))
    assert engine.tokenizer.chat_template == TEMPLATE
    assert engine.tokenizer.apply_chat_template(messages) == expected
    default = Engine(dataclasses.replace(engine_config, chat_template=None, cache=CacheConfig(num_blocks=8)))
    assert default.tokenizer.apply_chat_template(messages) != expected


# -- LLM with the articles' constructor arguments -----------------------------------------------------
def test_llm_takes_the_articles_arguments(tiny_tied_dir: Path) -> None:
    from swiftlm.sampling import SamplingParams

    llm = LLM(
        model=str(tiny_tied_dir), dtype="float32", enable_reasoning=True, reasoning_parser="deepseek_r1",
        gpu_memory_utilization=0.82, max_model_len=8192, block_size=32, max_num_seqs=2,
    )  # fmt: skip
    plain = LLM(str(tiny_tied_dir), dtype="float32", max_model_len=8192, block_size=32, max_num_seqs=2)
    assert llm.engine.config.cache.block_size == 32
    assert llm.engine.kv.pool.num_usable_blocks == plain.engine.kv.pool.num_usable_blocks  # no effect on a CPU
    params = SamplingParams(temperature=0.0, top_p=0.95, max_tokens=6, prompt_logprobs=None, ignore_eos=True)
    prompts = ["<think>如何计算圆的面积？</think>圆的面积公式是πr²，其中r是半径。", "用Python写一个快速排序函数"]
    outputs = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    assert all(len(o.outputs[0].token_ids) == 6 and o.prompt == p for o, p in zip(outputs, prompts, strict=True))
