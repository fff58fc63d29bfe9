"""Seeing a live server: the device and process metrics, the vLLM names, ``swiftlm top`` drawn from
its /metrics, the Grafana dashboard's expressions against what it exports, and the playground's files.

One server (the scripted checkpoint, ``--metric-names vllm``, an API key) serves every test here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from swiftlm.config import ServerConfig
from swiftlm.server.app import create_app
from swiftlm.server.operations.device_metrics import NvmlCollector
from swiftlm.top.command import run_top
from swiftlm.top.scrape import fetch
from swiftlm.top.window import Window
from tests.server.conftest import ANSWER, free_port
from tests.unit.test_device_metrics import FakeNvml

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-observe"
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "info": ("_info",), "gauge": ("",)}


@pytest.fixture(scope="module")
def server(start_server, scripted_model_dir):
    return start_server(scripted_model_dir, ServerConfig(api_key=KEY, metric_names="vllm"))


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def chat(server, n: int = 2, **extra) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key=KEY)
    for _ in range(n):
        stream = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=16, stream=True, extra_body=extra)
        assert ANSWER in "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_device_and_process_metrics_have_their_types(server) -> None:
    chat(server, 1)
    text = httpx.get(server.base_url + "/metrics").text  # open without the key
    got = families(text)
    assert got["process_cpu_seconds"].type == "counter" and got["process_cpu_seconds"].samples[0].value > 0
    assert got["process_resident_memory_bytes"].type == "gauge"
    assert got["process_resident_memory_bytes"].samples[0].value > 10 * 2**20
    threads = got["swiftlm:compute_threads"]
    assert threads.type == "gauge" and threads.samples[0].value >= 1
    assert threads.samples[0].labels == {"model_name": server.model}
    info = got["swiftlm:backend_info"]  # an info metric: in the Prometheus text format a gauge of 1 named *_info
    assert info.type == "gauge" and len(info.samples) == 1 and info.samples[0].value == 1
    assert "# TYPE swiftlm:backend_info gauge" in text
    plan = info.samples[0].labels
    assert plan["device"] == "cpu" and plan["dtype"] == "float32" and plan["quantization"] == "none"
    assert plan["threads"] == str(int(threads.samples[0].value)) and plan["kernels"]
    assert plan["backend"] and plan["fallbacks"]  # "none" or the ops that fell back
    assert not [name for name in got if name.startswith("swiftlm:gpu_")]  # NVML only on CUDA


def test_vllm_names_mirror_the_swiftlm_ones(server) -> None:
    chat(server, 1)
    got = families(httpx.get(server.base_url + "/metrics").text)
    pairs = {
        "vllm:time_to_first_token_seconds": "swiftlm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds": "swiftlm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds": "swiftlm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds": "swiftlm:request_queue_time_seconds",
        "vllm:num_requests_running": "swiftlm:num_requests_running",
        "vllm:num_requests_waiting": "swiftlm:num_requests_waiting",
        "vllm:kv_cache_usage_perc": "swiftlm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc": "swiftlm:kv_cache_usage_perc",
        "vllm:prompt_tokens": "swiftlm:prompt_tokens",
        "vllm:generation_tokens": "swiftlm:generation_tokens",
        "vllm:request_success": "swiftlm:request_success",
        "vllm:prefix_cache_queries": "swiftlm:prefix_cache_queries",
        "vllm:prefix_cache_hits": "swiftlm:prefix_cache_hits",
    }
    for vllm, ours in pairs.items():
        assert got[vllm].type == got[ours].type, vllm
        theirs = {(s.name.replace(vllm, ours, 1), tuple(sorted(s.labels.items()))) for s in got[vllm].samples}
        mine = {(s.name, tuple(sorted(s.labels.items()))) for s in got[ours].samples}
        assert theirs == mine, vllm  # same samples, same labels (model_name)
    success = [s for s in got["vllm:request_success"].samples if s.name == "vllm:request_success_total"]
    assert success and all(s.labels["model_name"] == server.model and "finished_reason" in s.labels for s in success)
    ttft = [s for s in got["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_count")]
    assert ttft[0].value >= 1
    copied = {n.removesuffix("_created") for n in got if n.startswith("vllm:")}
    spec = {f"vllm:spec_decode_num_{n}" for n in ("drafts", "draft_tokens", "accepted_tokens")}
    assert copied == set(pairs) | spec | {"vllm:time_per_output_token_seconds", "vllm:num_preemptions",
                                          "vllm:request_time_per_output_token_seconds"}  # only metrics vLLM has


def test_top_draws_a_frame_of_the_live_server(server) -> None:
    window = Window()
    window.add(fetch(server.base_url, None))
    chat(server, 3)
    figures = window.add(fetch(server.base_url + "/v1", None))
    assert figures.span_s is not None and figures.output_tok_per_s > 0
    assert figures.ttft_p50 is not None and figures.ttft_p50 <= figures.ttft_p95
    console = Console(record=True, width=130, color_system=None)
    from swiftlm.top.view import frame

    console.print(frame(server.base_url, figures))
    text = console.export_text()
    print(text)
    assert server.model in text and "requests" in text and "latency" in text and "device" in text
    ttft = re.search(r"TTFT p50\s+([\d.]+) ms", text)
    assert ttft and float(ttft.group(1)) == pytest.approx(figures.ttft_p50 * 1e3, abs=0.06)
    assert re.search(r"output\s+[\d.]+ tok/s", text) and re.search(r"running\s+0\b", text)
    assert "backend on cpu, float32, quant none" in text and re.search(r"threads\s+\d+", text)
    assert re.search(r"batch lines\s+0 queued, 0 running", text)


def test_top_command_prints_one_frame(server) -> None:
    console = Console(record=True, width=130, color_system=None)
    args = type("Args", (), {"url": server.base_url, "api_key": None, "interval": 0.2, "once": True})()
    assert run_top(args, console) == 0
    text = console.export_text()
    assert re.search(r"window: last 0\.\d s", text) and "KV cache use" in text and "prefix-cache hits" in text


def test_top_against_a_dead_url_is_one_line_and_exit_1() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run([sys.executable, "-m", "swiftlm", "top", "--url", url, "--once"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"error: cannot reach {url}/metrics: [Errno 111] Connection refused"]
    assert "Traceback" not in done.stderr and done.stdout == ""


# -- the Grafana dashboard and the Prometheus example --------------------------------------------
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "inf", "nan"}


def promql_metrics(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers that are not functions, keywords, label
    names (inside {...} or by (...)), ranges, strings or numbers."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\$\w+", "", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word, rest = match.group(), text[match.end():].lstrip()
        if rest.startswith("(") or word.lower() in PROMQL_WORDS:
            continue  # a function or an aggregation
        names.add(word)
    return names


def test_promql_metrics_reads_names_only() -> None:
    expr = ('histogram_quantile(0.95, sum by (le, model_name) (rate(swiftlm:x_seconds_bucket'
            '{model_name=~"$model_name", le!="+Inf"}[$__rate_interval]))) / on(instance) group_left process_y')
    assert promql_metrics(expr) == {"swiftlm:x_seconds_bucket", "process_y"}


def exported_names(text: str) -> set[str]:
    """Every series name a scrape declares: a family's samples by its type's suffixes (a labelled
    family declared without samples yet counts too)."""
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
        names |= {s.name for s in family.samples}
    return names


def dashboard_exprs(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_dashboard_names_only_exported_metrics(server) -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/swiftlm.json").read_text())
    exported = exported_names(httpx.get(server.base_url + "/metrics").text)
    # a CPU server has no GPU: the GPU lines are the ones NVML's collector yields (over a fake NVML)
    exported |= {s.name for family in NvmlCollector(lambda: FakeNvml(gpus=1)).collect() for s in family.samples}
    used: set[str] = set()
    for expr in dashboard_exprs(dashboard):
        assert expr.count("(") == expr.count(")"), expr
        label_values = re.fullmatch(r"label_values\((\S+), \w+\)", expr)
        names = {label_values.group(1)} if label_values else promql_metrics(expr)
        assert names, f"no metric in {expr!r}"
        assert names <= exported, f"{expr!r} names metrics /metrics does not export: {sorted(names - exported)}"
        used |= names
    for figure in ("swiftlm:num_requests_waiting", "swiftlm:request_rejected_total", "swiftlm:generation_tokens_total",
                   "swiftlm:time_to_first_token_seconds_bucket", "swiftlm:inter_token_latency_seconds_bucket",
                   "swiftlm:kv_cache_usage_perc", "swiftlm:prefix_cache_hits_total", "swiftlm:num_sessions",
                   "swiftlm:batch_lines_queued", "process_cpu_seconds_total", "swiftlm:gpu_utilization_perc"):
        assert figure in used, f"the dashboard has no panel on {figure}"


def test_dashboard_has_the_fields_grafana_needs() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/swiftlm.json").read_text())
    assert dashboard["title"] and dashboard["uid"] and isinstance(dashboard["schemaVersion"], int)
    assert dashboard["schemaVersion"] >= 36 and dashboard["time"]["from"].startswith("now-")
    assert {i["name"] for i in dashboard["__inputs"]} == {"DS_PROMETHEUS"}
    ids, cells = set(), set()
    for panel in dashboard["panels"]:
        assert panel["id"] not in ids and panel["title"] and panel["type"] in {"row", "timeseries", "gauge", "stat", "table"}
        ids.add(panel["id"])
        g = panel["gridPos"]
        assert all(isinstance(g[k], int) for k in "hwxy") and g["x"] + g["w"] <= 24 and g["h"] > 0
        covered = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not covered & cells, f"panel {panel['title']!r} overlaps another"
        cells |= covered
        if panel["type"] != "row":
            assert panel["datasource"]["type"] == "prometheus" and panel["targets"]
            assert all(t["refId"] and t["expr"] for t in panel["targets"])
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"model_name", "instance"} <= variables
    for expr in dashboard_exprs(dashboard):
        for var in re.findall(r"\$(\w+)", expr):
            assert var in variables or var.startswith("__"), f"{expr!r} uses an undefined ${var}"


def test_prometheus_example_scrapes_metrics() -> None:
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    job = config["scrape_configs"][0]
    assert job["metrics_path"] == "/metrics" and job["static_configs"][0]["targets"]


# -- the playground's files ---------------------------------------------------------------------
def test_playground_is_served_without_the_key_and_can_be_turned_off(server) -> None:
    page = httpx.get(server.base_url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="/ui/app.js">' in page.text
    script = httpx.get(server.base_url + "/ui/app.js")
    assert script.status_code == 200 and "text/javascript" in script.headers["content-type"]
    assert "/v1/chat/completions" in script.text and "session_id" in script.text and "Bearer" in script.text
    assert httpx.get(server.base_url + "/ui/style.css").headers["content-type"].startswith("text/css")
    assert httpx.get(server.base_url + "/ui/..%2Fapp.py").status_code == 404
    missing = httpx.get(server.base_url + "/ui/secrets.txt")
    assert missing.status_code == 404 and "no file 'secrets.txt'" in missing.json()["error"]["message"]
    assert httpx.get(server.base_url + "/v1/models").status_code == 401  # the API still needs the key
    with TestClient(create_app(None, ServerConfig(enable_ui=False), "m")) as client:
        assert client.get("/").status_code == 404 and client.get("/ui/app.js").status_code == 404
    no_cdn = "".join(httpx.get(server.base_url + p).text for p in ("/", "/ui/app.js", "/ui/style.css"))
    assert not re.search(r"https?://", no_cdn)


def test_serve_flags_reach_the_config() -> None:
    from swiftlm.cli import build_configs, build_parser

    args = build_parser().parse_args(["serve", "m", "--no-webui", "--metric-names", "vllm"])
    _, config = build_configs(args)
    assert config.enable_ui is False and config.metric_names == "vllm"
    _, default = build_configs(build_parser().parse_args(["serve", "m"]))
    assert default.enable_ui is True and default.metric_names == "swiftlm"
