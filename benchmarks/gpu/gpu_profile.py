"""Where a step's time goes on a CUDA device: GPU time of the captured decode graphs, host time of
the engine (cProfile) and the kernels of a prefill and a few decode steps (torch.profiler).

    PYTHONPATH=src python3 benchmarks/gpu/gpu_profile.py --out "$OUT"          # on the GPU
    PYTHONPATH=src python3 benchmarks/gpu/gpu_profile.py --device cpu --out /tmp/gp  # dry run (CPU backend)

On the Qwen3-0.6B shape with random weights, bfloat16. Each part writes its file under ``--out`` as
it ends: ``timings.json`` (graph replay ms per bucket, TTFT / TPOT at concurrency 1, 16-way step
time, a short throughput run), ``host_<part>.txt`` (cProfile, sorted by own time and by cumulative
time), ``kernels.txt`` (torch.profiler's table by device time and by host time) and
``trace.json.gz`` (the profiler's timeline, for chrome://tracing or Perfetto).
"""

from __future__ import annotations

import argparse
import cProfile
import gzip
import io
import json
import pstats
import random
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # gpu_check_models
from gpu_check_models import prompts_for, qwen3_checkpoint  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=Path("gpu_profile_out"))
    p.add_argument("--layers", type=int, help="layers of the model (default: 28; cpu: 2)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    return p.parse_args(argv)


def host_profile(fn: Any, path: Path, rows: int = 45) -> Any:
    """Run ``fn()`` under cProfile; write its table (own time, then cumulative time) to ``path``."""
    prof = cProfile.Profile()
    prof.enable()
    try:
        result = fn()
    finally:
        prof.disable()
    text = io.StringIO()
    for key in ("tottime", "cumulative"):
        text.write(f"==== sorted by {key}\n")
        pstats.Stats(prof, stream=text).sort_stats(key).print_stats(rows)
    path.write_text(text.getvalue())
    return result


def sync(device: str) -> None:
    import torch

    if device != "cpu":
        torch.cuda.synchronize()


def free_device_memory(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device != "cpu":
        torch.cuda.empty_cache()


def graph_replay_ms(llm: Any, device: str) -> dict[str, float]:
    """GPU time of one replay of each captured decode graph (median of 5 x 20 replays)."""
    import torch

    graphs = getattr(llm.engine.backend, "graphs", None)
    if graphs is None or device == "cpu":
        return {}
    out = {}
    for size in graphs.sizes:
        graph = graphs._graphs[size]
        runs = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            runs.append(start.elapsed_time(end) / 20)
        out[str(size)] = round(statistics.median(runs), 4)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cpu = args.device == "cpu"
    layers = args.layers or (2 if cpu else None)
    work = Path(tempfile.mkdtemp(prefix="swiftlm_gpu_profile_"))
    timings: dict[str, Any] = {}

    def save() -> None:
        (args.out / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")

    def part(name: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn()
        except Exception as exc:
            traceback.print_exc()
            timings[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
            return None
        finally:
            timings[f"{name}_seconds"] = round(time.perf_counter() - t0, 2)
            save()
            print(f"[gpu_profile] {name} done", flush=True)

    from swiftlm import LLM, SamplingParams

    path = qwen3_checkpoint(work, layers)
    extra = {} if cpu else {"gpu_memory_utilization": args.gpu_memory_utilization}
    llm = LLM(str(path), dtype="bfloat16", device=args.device, max_num_seqs=16, max_model_len=2048,
              max_num_batched_tokens=2048, **extra)
    timings["backend"] = llm.engine.backend.describe().splitlines()
    prompts = prompts_for(7, 60, 128, 128)  # each measurement below on prompts no earlier step cached
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    p128 = SamplingParams(max_tokens=128, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompts[0]}], p128)  # warm-up: kernels compiled
    llm.generate([{"prompt_token_ids": p} for p in prompts[40:56]], SamplingParams(max_tokens=8, ignore_eos=True))

    timings["graph_replay_ms"] = part("graphs", lambda: graph_replay_ms(llm, args.device))

    def latency() -> None:
        ttft, total = [], []
        for i in range(5):
            t0 = time.perf_counter()
            llm.generate([{"prompt_token_ids": prompts[2 + i]}], one)
            ttft.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            llm.generate([{"prompt_token_ids": prompts[8 + i]}], p128)
            total.append(time.perf_counter() - t0)
        t1 = statistics.median(ttft) * 1e3
        timings["ttft_ms"] = round(t1, 3)
        timings["tpot_ms"] = round((statistics.median(total) * 1e3 - t1) / 127, 3)
        # the engine step alone: one decode step of an idle engine, timed around step()
        engine = llm.engine
        t0 = time.perf_counter()
        llm.generate([{"prompt_token_ids": prompts[14]}], SamplingParams(max_tokens=2, ignore_eos=True))
        timings["generate_2_tokens_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        del engine

    part("latency", latency)
    part("host_ttft", lambda: host_profile(
        lambda: [llm.generate([{"prompt_token_ids": prompts[20 + i]}], one) for i in range(5)],
        args.out / "host_ttft.txt"))
    part("host_decode", lambda: host_profile(
        lambda: llm.generate([{"prompt_token_ids": prompts[26]}], p128), args.out / "host_decode.txt"))

    def decode16() -> None:
        batch = [{"prompt_token_ids": [t + 1 for t in p]} for p in prompts[:16]]
        t0 = time.perf_counter()
        host_profile(lambda: llm.generate(batch, SamplingParams(max_tokens=128, ignore_eos=True)),
                     args.out / "host_decode16.txt")
        timings["decode16_ms_per_step_profiled"] = round((time.perf_counter() - t0) * 1e3 / 128, 3)

    part("decode16", decode16)

    def kernels() -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([] if cpu else [ProfilerActivity.CUDA])
        with profile(activities=activities) as prof:
            llm.generate([{"prompt_token_ids": prompts[30]}], SamplingParams(max_tokens=6, ignore_eos=True))
            sync(args.device)
        text = io.StringIO()
        device_key = "self_cpu_time_total" if cpu else "self_device_time_total"
        text.write(prof.key_averages().table(sort_by=device_key, row_limit=40) + "\n")
        text.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40) + "\n")
        (args.out / "kernels.txt").write_text(text.getvalue())
        trace = work / "trace.json"
        prof.export_chrome_trace(str(trace))
        with open(trace, "rb") as src, gzip.open(args.out / "trace.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        del torch

    part("kernels", kernels)

    def throughput() -> None:
        nonlocal llm
        del llm  # its KV pool: the throughput engine takes the device's memory anew
        free_device_memory(args.device)
        rng = random.Random(0)
        n, lo, hi = (8, 16, 64) if cpu else (256, 100, 1024)
        ps = [[rng.randrange(10, 150000) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
        params = [SamplingParams(temperature=0.6, max_tokens=rng.randint(lo, hi), ignore_eos=True) for _ in range(n)]
        big = LLM(str(path), dtype="bfloat16", device=args.device, max_num_seqs=256, max_model_len=2 * hi + 64,
                  max_num_batched_tokens=512 if cpu else 16384, **extra)
        big.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=8, ignore_eos=True))
        t0 = time.perf_counter()
        outs = host_profile(lambda: big.generate([{"prompt_token_ids": p} for p in ps], params),
                            args.out / "host_throughput.txt")
        seconds = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        timings["throughput_profiled_tok_per_s"] = round(tokens / seconds, 1)

    part("throughput", throughput)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
