"""The metrics collectors without a server (NVML through a fake module, the vLLM copies) and the
figures of ``swiftlm top`` (quantiles of bucket deltas, the window, parsing /metrics text)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import httpx
import pytest
import torch
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from swiftlm.server.operations.device_metrics import NvmlCollector
from swiftlm.server.operations.vllm_metric_names import WithVllmNames
from swiftlm.top.scrape import Scrape, TopError, fetch, metrics_url, parse
from swiftlm.top.window import Window, bucket_delta, quantile


class NvmlError(Exception):
    pass


class FakeNvml:
    """The part of ``pynvml`` the collector calls: ``gpus`` boards; board 1 reports no power
    (NVML_ERROR_NOT_SUPPORTED); ``init_error`` makes nvmlInit fail as without a driver."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, gpus: int = 2, init_error: bool = False) -> None:
        self.gpus, self.init_error, self.inits = gpus, init_error, 0

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init_error:
            raise NvmlError("Driver Not Loaded")

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes | str:
        return b"NVIDIA H200" if h == 0 else "NVIDIA L4"

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=37 + h, memory=5)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=(h + 1) * 2**30, total=80 * 2**30, free=0)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        if h == 1:
            raise NvmlError("Not Supported")
        return 251_500  # milliwatts

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 61 + h


def samples(collector) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels["gpu"]): s.value for family in collector.collect() for s in family.samples}


def test_nvml_lines_per_gpu_in_base_units() -> None:
    fake = FakeNvml()
    collector = NvmlCollector(lambda: fake)
    got = samples(collector)
    assert got[("swiftlm:gpu_utilization_perc", "0")] == pytest.approx(0.37)
    assert got[("swiftlm:gpu_memory_used_bytes", "1")] == 2 * 2**30
    assert got[("swiftlm:gpu_memory_total_bytes", "0")] == 80 * 2**30
    assert got[("swiftlm:gpu_power_watts", "0")] == pytest.approx(251.5)
    assert ("swiftlm:gpu_power_watts", "1") not in got  # not supported on that board: left out
    assert got[("swiftlm:gpu_temperature_celsius", "1")] == 62
    names = {s.labels["name"] for f in collector.collect() for s in f.samples}
    assert names == {"NVIDIA H200", "NVIDIA L4"}
    assert {(f.name, f.type) for f in collector.collect()} == {
        ("swiftlm:gpu_utilization_perc", "gauge"), ("swiftlm:gpu_memory_used_bytes", "gauge"),
        ("swiftlm:gpu_memory_total_bytes", "gauge"), ("swiftlm:gpu_power_watts", "gauge"),
        ("swiftlm:gpu_temperature_celsius", "gauge"),
    }
    assert fake.inits == 1  # NVML starts once, on the first scrape


def test_absent_nvml_is_one_warning_and_no_lines(caplog: pytest.LogCaptureFixture) -> None:
    def missing():
        raise ModuleNotFoundError("No module named 'pynvml'")

    collector = NvmlCollector(missing)
    with caplog.at_level(logging.WARNING, logger="swiftlm.server"):
        assert samples(collector) == {} and samples(collector) == {}
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == ["GPU metrics are off: NVML is not installed (pip install nvidia-ml-py)"]


def test_nvml_without_a_driver_is_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml(init_error=True)
    collector = NvmlCollector(lambda: fake)
    with caplog.at_level(logging.WARNING, logger="swiftlm.server"):
        assert samples(collector) == {} and samples(collector) == {}
    assert [r.getMessage() for r in caplog.records] == ["GPU metrics are off: NVML did not start: Driver Not Loaded"]
    assert fake.inits == 1


def test_vllm_copies_keep_suffixes_labels_and_values() -> None:
    source = CollectorRegistry()
    ttft = Histogram("swiftlm:time_to_first_token_seconds", "t", ["model_name"], registry=source, buckets=(0.1, 1.0))
    done = Counter("swiftlm:request_success", "d", ["model_name", "finished_reason"], registry=source)
    Counter("swiftlm:tool_call_parse_errors", "no vLLM twin", ["model_name"], registry=source).labels("m").inc()
    ttft.labels("m").observe(0.05)
    ttft.labels("m").observe(0.5)
    done.labels("m", "stop").inc(3)
    copies = CollectorRegistry(auto_describe=False)
    copies.register(WithVllmNames(source))
    got = {f.name: f for f in text_string_to_metric_families(generate_latest(copies).decode())}
    assert {n for n in got if not n.endswith("_created")} == {
        "swiftlm:time_to_first_token_seconds", "swiftlm:request_success", "swiftlm:tool_call_parse_errors",
        "vllm:time_to_first_token_seconds", "vllm:request_success",
    }
    buckets = {s.labels["le"]: s.value for s in got["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_bucket")}
    assert buckets == {"0.1": 1.0, "1.0": 2.0, "+Inf": 2.0}
    total = [s for s in got["vllm:request_success"].samples if s.name == "vllm:request_success_total"]
    assert [(s.labels, s.value) for s in total] == [({"model_name": "m", "finished_reason": "stop"}, 3.0)]


def test_quantile_interpolates_within_a_bucket() -> None:
    buckets = [(0.1, 10.0), (0.2, 30.0), (0.4, 40.0), (float("inf"), 40.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.15)  # rank 20: half way into (0.1, 0.2]
    assert quantile(0.25, buckets) == pytest.approx(0.1)
    assert quantile(0.1, buckets) == pytest.approx(0.04)  # the first bucket starts at 0
    assert quantile(0.95, buckets) == pytest.approx(0.2 + 0.2 * (38 - 30) / 10)
    assert quantile(0.99, [(0.1, 1.0), (float("inf"), 5.0)]) == 0.1  # in +Inf: the largest finite bound
    assert quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None


def scrape_of(text: str, at: float) -> Scrape:
    return parse(text, at)


def metrics_text(ttft: dict[str, float], tokens: float, rejected: float = 0) -> str:
    lines = ["# TYPE swiftlm:time_to_first_token_seconds histogram"]
    lines += [f'swiftlm:time_to_first_token_seconds_bucket{{le="{le}",model_name="m"}} {v}' for le, v in ttft.items()]
    lines += ["# TYPE swiftlm:generation_tokens counter", f'swiftlm:generation_tokens_total{{model_name="m"}} {tokens}',
              "# TYPE swiftlm:request_rejected counter",
              f'swiftlm:request_rejected_total{{model_name="m",reason="queue_full"}} {rejected}',
              "# TYPE swiftlm:num_requests_running gauge", 'swiftlm:num_requests_running{model_name="m"} 2']
    return "\n".join(lines) + "\n"


def test_window_figures_come_from_deltas_over_the_last_minute() -> None:
    window = Window(span_s=60)
    first = window.add(scrape_of(metrics_text({"0.1": 100, "1.0": 100, "+Inf": 100}, 1000), 0.0))
    assert first.span_s is None and first.output_tok_per_s is None
    assert first.ttft_p50 == pytest.approx(0.05)  # one scrape: everything since the start
    # 10 s later: 10 new requests, all slow; the old fast ones are outside the delta
    second = window.add(scrape_of(metrics_text({"0.1": 100, "1.0": 110, "+Inf": 110}, 1500, rejected=4), 10.0))
    assert second.span_s == 10.0 and second.output_tok_per_s == pytest.approx(50.0)
    assert second.ttft_p50 == pytest.approx(0.1 + 0.9 * 0.5) and second.refused == 4
    assert second.refused_by_reason == {"queue_full": 4} and second.running == 2
    # 70 s after the first: the first scrape has left the window; the base is the one at 10 s
    third = window.add(scrape_of(metrics_text({"0.1": 100, "1.0": 110, "+Inf": 110}, 2100, rejected=4), 70.0))
    assert third.span_s == 60.0 and third.output_tok_per_s == pytest.approx(10.0)
    assert third.ttft_p50 is None and third.refused == 0


def test_a_restarted_server_counts_from_zero() -> None:
    old = scrape_of(metrics_text({"0.1": 50, "+Inf": 50}, 900), 0.0)
    new = scrape_of(metrics_text({"0.1": 3, "+Inf": 4}, 20), 5.0)
    assert bucket_delta(new, old, "swiftlm:time_to_first_token_seconds") == [(0.1, 3.0), (float("inf"), 4.0)]


def test_metrics_url_accepts_base_v1_and_metrics_urls() -> None:
    assert metrics_url("http://h:8000") == "http://h:8000/metrics"
    assert metrics_url("http://h:8000/v1/") == "http://h:8000/metrics"
    assert metrics_url("h:9000/metrics") == "http://h:9000/metrics"


@pytest.mark.parametrize(("status", "body", "message"), [
    (200, "# TYPE node_cpu counter\nnode_cpu_total 3\n", "is not swiftlm (no swiftlm: metrics)"),
    (200, "<html><body>hello</body></html>", "not Prometheus metrics"),
    (404, '{"detail": "Not Found"}', "answered HTTP 404; is it a swiftlm server?"),
    (401, "", "needs an API key (--api-key)"),
])
def test_servers_that_are_not_swiftlm_are_one_clear_error(status: int, body: str, message: str) -> None:
    client = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(status, text=body)))
    with pytest.raises(TopError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        fetch("http://other:8000", client=client)


def test_the_key_is_sent_as_a_bearer_token() -> None:
    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, text=metrics_text({"+Inf": 0}, 0))

    fetch("http://h", api_key="k1", client=httpx.Client(transport=httpx.MockTransport(answer)))
    assert seen == ["Bearer k1"]


def test_a_frame_shows_each_gpu_and_a_failed_scrape() -> None:
    from rich.console import Console

    from swiftlm.top.view import frame

    registry = CollectorRegistry()
    registry.register(NvmlCollector(lambda: FakeNvml()))
    text = metrics_text({"+Inf": 0}, 0) + generate_latest(registry).decode()
    console = Console(record=True, width=160, color_system=None)
    console.print(frame("http://h/metrics", Window().add(parse(text, 0.0)), problem="cannot reach http://h/metrics"))
    shown = console.export_text()
    assert "GPU 0 NVIDIA H200" in shown and "37.0 % busy, 1.00 GiB / 80.00 GiB, 252 W, 61 C" in shown
    assert "GPU 1 NVIDIA L4" in shown and "n/a, 62 C" in shown  # no power reading on that board
    assert "last scrape failed: cannot reach http://h/metrics (retrying)" in shown


def test_top_reads_metrics_text_only() -> None:
    """``swiftlm top`` watches any server over HTTP: it imports nothing of swiftlm outside ``swiftlm.top``."""
    import ast
    from pathlib import Path

    import swiftlm.top

    for path in Path(swiftlm.top.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith("swiftlm") or name.startswith("swiftlm.top"), f"{path.name} imports {name}"


def fake_engine(device: str) -> SimpleNamespace:
    backend = SimpleNamespace(name="cuda", device=device, plan=["attention: triton paged"], fallbacks=[])
    config = SimpleNamespace(quantization="int8", cache=SimpleNamespace(kv_cache_dtype="fp8"))
    return SimpleNamespace(backend=backend, config=config, dtype=torch.bfloat16)


def test_a_cuda_engine_gets_the_gpu_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    from swiftlm.server.operations import device_metrics
    from swiftlm.server.operations.metrics import ServerMetrics

    monkeypatch.setattr(device_metrics, "import_pynvml", lambda: FakeNvml(gpus=1))
    metrics = ServerMetrics("m", lambda: None)
    metrics.watch_device(fake_engine("cuda:0"))
    got = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    assert got["swiftlm:gpu_memory_total_bytes"].samples[0].value == 80 * 2**30
    plan = got["swiftlm:backend_info"].samples[0].labels
    assert plan == {"model_name": "m", "backend": "cuda", "device": "cuda:0", "dtype": "bfloat16", "quantization": "int8",
                    "kv_cache_dtype": "fp8", "threads": str(torch.get_num_threads()),
                    "kernels": "attention: triton paged", "fallbacks": "none"}
    cpu = ServerMetrics("m", lambda: None)
    cpu.watch_device(fake_engine("cpu"))
    assert b"swiftlm:gpu_" not in cpu.render()  # NVML is never loaded off CUDA
