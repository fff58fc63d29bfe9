"""Each ``vllm serve`` command line of article 002, with ``vllm serve`` replaced by ``swiftlm serve``,
starts a server that becomes healthy and answers a chat.

The command lines are copied below verbatim from the article's text (where its code blocks are
flattened onto one line), starting at ``vllm serve``; ``test_commands_are_the_articles`` checks
them against ../shared/reference/ when that directory is there. Clean-up, applied by ``argv``:

- ``vllm serve`` -> ``swiftlm serve``;
- the inline comments (``\\ # 关键！...`` up to the next flag) and the line-continuation
  backslashes removed;
- ``...`` removed, except in the article's "wrong configuration" line ``vllm serve ...
  --disable-log-stats``, where it stands for the rest of the command, model included: there it is
  replaced by ``Qwen/Qwen3-0.6B``, or the line would name no model;
- the port: ``--port 8000`` changed to a free port, ``--port N`` added where the line has none
  (its default, 8000, is the same);
- ``Qwen/Qwen3-0.6B`` is resolved with ``HF_HUB_OFFLINE=1`` from a hub-layout cache
  (``HF_HUB_CACHE``) holding the scripted checkpoint under that id.

In CI each command line runs through the real CLI (``swiftlm.cli.main``: the parser, the flag checks,
the configs it builds) with the server in the test's process
(``test_command_configures_a_server_that_answers``), and two of them, those with the most flags, also
as ``swiftlm serve`` child processes (``test_command_serves_a_chat``; all six with ``-m slow``: a child
costs ~7 s of CPU to start). The child servers of a run start at once (one module fixture); each
test waits for its own.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import openai
import pytest

from swiftlm.cli import main
from tests.conftest import ANSWER
from tests.reference.conftest import HUB_ID, offline_env
from tests.server.conftest import free_port, free_ports, run_uvicorn

ARTICLE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "002_1fa5de43ae0dd110.txt"

COMMANDS = {
    "1.1 max-model-len": (
        r"vllm serve Qwen/Qwen3-0.6B \ --enable-reasoning \ --reasoning-parser deepseek_r1 \ --max-model-len 8192 \ "
        r"# 关键！匹配实际需求 --block-size 32 \ # 比默认16更适配小模型 --gpu-memory-utilization 0.82 \ "
        r"# 留出缓冲，防OOM --host 0.0.0.0 --port 8000"
    ),
    "1.2 wrong": r"vllm serve ... --disable-log-stats",
    "1.2 prefix caching": (
        r"vllm serve Qwen/Qwen3-0.6B \ --enable-prefix-caching \ # 必须开启 --disable-log-stats false \ "
        r"# 显式设为false（默认即true，但明确写更安全） --max-model-len 8192"
    ),
    "2.1 memory": (
        r"vllm serve Qwen/Qwen3-0.6B \ --gpu-memory-utilization 0.82 \ # 核心参数！ --swap-space 4 \ "
        r"# 启用CPU交换，防突发OOM --max-num-batched-tokens 2048 # 控制批处理上限，防长文本阻塞"
    ),
    "2.2 scheduler steps": (
        r"vllm serve Qwen/Qwen3-0.6B \ --num-scheduler-steps 4 \ # 每次调度最多处理4个请求 --max-num-seqs 128 \ "
        r"# 提高并发请求数上限 --max-num-batched-tokens 4096 # 批处理token上限（平衡延迟与吞吐）"
    ),
    "5.1 queue limits": (
        r"vllm serve Qwen/Qwen3-0.6B \ --max-num-seqs 64 \ # 最大并发请求数 --max-num-batched-tokens 4096 \ "
        r"# 批处理token总数上限 --max-queue-waiting-time 1000 \ # 队列等待超时（毫秒） --enforce-eager \ "
        r"# 禁用CUDA Graph（小模型更稳） ..."
    ),
}


def argv(command: str, port: int) -> list[str]:
    """The ``swiftlm`` arguments for one of the article's command lines, cleaned up as listed above."""
    words = command.split()
    assert words[:2] == ["vllm", "serve"], command
    if words[2] == "...":  # the "wrong configuration" line: `...` is the rest of the command
        words[2] = HUB_ID
    args, in_comment = ["serve"], False
    for word in words[2:]:
        if word.startswith("#"):
            in_comment = True
        elif word.startswith("--"):
            in_comment = False
        if in_comment or word in ("\\", "..."):
            continue
        args.append(word)
    if "--port" in args:
        args[args.index("--port") + 1] = str(port)
    else:
        args += ["--port", str(port)]
    return args


def test_argv_cleanup() -> None:
    assert argv(COMMANDS["1.1 max-model-len"], 9) == [
        "serve", HUB_ID, "--enable-reasoning", "--reasoning-parser", "deepseek_r1", "--max-model-len", "8192",
        "--block-size", "32", "--gpu-memory-utilization", "0.82", "--host", "0.0.0.0", "--port", "9",
    ]  # fmt: skip
    assert argv(COMMANDS["1.2 wrong"], 9) == ["serve", HUB_ID, "--disable-log-stats", "--port", "9"]
    assert argv(COMMANDS["5.1 queue limits"], 9) == [
        "serve", HUB_ID, "--max-num-seqs", "64", "--max-num-batched-tokens", "4096",
        "--max-queue-waiting-time", "1000", "--enforce-eager", "--port", "9",
    ]  # fmt: skip
    for command in COMMANDS.values():
        args = argv(command, 9)
        assert not any(a.startswith("#") or a in ("\\", "...") for a in args), args
        flags = [w for w in command.split() if w.startswith("--") and w != "--port"]
        assert flags == [a for a in args if a.startswith("--") and a != "--port"]


def test_commands_are_the_articles() -> None:
    if not ARTICLE.is_file():
        pytest.skip(f"{ARTICLE} is not here")
    text = ARTICLE.read_text()
    for name, command in COMMANDS.items():
        assert command in text, name
    assert text.count("vllm serve ") == len(COMMANDS)


# the two whose child processes CI starts: the most flags (host, block size, memory, reasoning
# parser; queue limits, --enforce-eager and the trailing "...")
IN_CI = ("1.1 max-model-len", "5.1 queue limits")


def _chat(v1: str) -> str:
    client = openai.OpenAI(base_url=v1, api_key="EMPTY")
    reply = client.chat.completions.create(
        model=HUB_ID, messages=[{"role": "user", "content": "你好"}], max_tokens=32, temperature=0
    )
    return reply.choices[0].message.content


@pytest.mark.parametrize("name", list(COMMANDS))
def test_command_configures_a_server_that_answers(
    name: str, hub_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``swiftlm.cli.main`` with the command's arguments, up to the call that would serve: the
    configs it hands over load the engine (the id resolved offline from the hub cache) and serve
    the chat, in this process."""
    import huggingface_hub.constants

    from swiftlm.engine.async_engine import AsyncEngine
    from swiftlm.engine.engine import Engine
    from swiftlm.server import launch
    from swiftlm.server.app import create_app

    for key, value in offline_env(hub_cache).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    handed: list[tuple] = []
    monkeypatch.setattr(launch, "serve", lambda *args, **kwargs: handed.append((args, kwargs)))
    port = free_port()
    assert main(argv(COMMANDS[name], port)) == 0
    ((engine_config, server_config, quantization), _), = handed
    assert engine_config.model == HUB_ID and server_config.port == port
    if quantization not in (None, "none"):  # as launch.serve does
        engine_config = dataclasses.replace(engine_config, quantization=quantization)
    server_config = dataclasses.replace(server_config, batch_storage_dir=str(tmp_path / "batches"))
    engine = AsyncEngine(Engine(engine_config))
    server, thread = run_uvicorn(create_app(engine, server_config, engine_config.model), server_config, port)
    try:
        assert _chat(f"http://127.0.0.1:{port}/v1") == ANSWER
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        engine.shutdown(drain_timeout_s=1)


@pytest.fixture(scope="module")
def servers(request: pytest.FixtureRequest, serve_factory, hub_cache: Path) -> dict:
    """The child servers of the commands this run tests, started at once."""
    wanted = [item.callspec.params["name"] for item in request.session.items
              if item.originalname == "test_command_serves_a_chat" and hasattr(item, "callspec")]
    started = {}
    for name, port in zip(wanted, free_ports(len(wanted)), strict=True):
        started[name] = serve_factory(argv(COMMANDS[name], port), port, env=offline_env(hub_cache))
    return started


@pytest.mark.parametrize("name", [pytest.param(name, marks=() if name in IN_CI else pytest.mark.slow)
                                  for name in COMMANDS])
def test_command_serves_a_chat(servers: dict, serve_factory, hub_cache: Path, name: str) -> None:
    server = servers[name]
    code = server.wait_healthy()
    for _ in range(2):  # another process (a parallel test worker) took the port before the bind: a new one
        if code == 200 or not server.lost_port():
            break
        port = free_port()
        server = serve_factory(argv(COMMANDS[name], port), port, env=offline_env(hub_cache))
        code = server.wait_healthy()
    assert code == 200, f"{' '.join(server.argv[2:])}: GET /health {code}\n{server.log()}"
    assert _chat(server.v1) == ANSWER
