"""The GPU check: correctness against transformers, then throughput and latency, in stages.

    PYTHONPATH=src python scripts/gpu_check.py --device cuda --out "$OUT"     # on the GPU (scripts/gpu_check.sh)
    PYTHONPATH=src python scripts/gpu_check.py --device cpu --out /tmp/gc     # dry run: tiny sizes

Runs from the source tree (no install), in process (no HTTP server), without network. Each stage
writes ``<stage>.json`` under ``--out`` as soon as it ends (a run cut short still reports what it
finished), and ``summary.md`` is rewritten after every stage:

* ``env``: versions, device, memory;
* ``tiny_fp32``: a tiny random Qwen3, float32: swiftlm's greedy tokens equal transformers' (its own
  KV cache, on the same device), with CUDA graphs and with ``enforce_eager``;
* ``tiny_bf16``, ``qwen3_bf16``: bfloat16 top-1 agreement with transformers bfloat16: the share of
  positions where transformers' most likely next token (one forward over prompt + swiftlm's greedy
  answer) is swiftlm's, over the generated tokens (decode path) and the prompt rows (prefill path,
  from ``prompt_logprobs``); the tiny model must reach 99 %. Beside it, both against transformers
  float32, and transformers bf16's own agreement with its float32 (how much is bf16 noise);
* ``throughput``: nano-vllm's workload on the Qwen3-0.6B shape (random weights): 256 sequences, prompt
  and output lengths uniform in 100 .. 1024, ``ignore_eos``, fixed seed; output tokens per second;
* ``latency``: concurrency 1, 128 prompt tokens / 128 output tokens: TTFT and TPOT (medians);
* ``decode16``: 16 sequences decoding together: output tokens per second and time per step.

On ``--device cpu`` the tiny stages run the CUDA backend itself with its Triton kernels under the
interpreter (``TRITON_INTERPRET=1``), and the workload stages run the CPU backend on a 2-layer model
with small sizes: a check of the script, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_check_models import (
    TINY_BLOCKS,
    hf_argmax,
    hf_greedy,
    hf_model,
    prompts_for,
    qwen3_checkpoint,
    tiny_checkpoint,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda[:N], or cpu for a dry run (default: cuda)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check_out")))
    p.add_argument("--stages", default="env,tiny_fp32,tiny_bf16,qwen3_bf16,throughput,latency,decode16",
                   help="comma-separated stages to run, in order")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-seqs", type=int, help="throughput sequences (default: 256; cpu: 8)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    return p.parse_args(argv)


class Check:
    """The run's settings and where its results go."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = args.device
        self.cpu = args.device == "cpu"
        self.out: Path = args.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="swiftlm_gpu_check_"))
        self.results: dict[str, dict[str, Any]] = {}

    def engine_kwargs(self, **extra: Any) -> dict[str, Any]:
        if self.cpu:
            return extra
        return {"gpu_memory_utilization": self.args.gpu_memory_utilization, **extra}

    def backend(self, enforce_eager: bool = False) -> Any:
        """On the dry run: the CUDA backend under Triton's interpreter; on CUDA: None (chosen from the config)."""
        if not self.cpu:
            return None
        from swiftlm.backends.cuda.backend import CudaBackend

        return CudaBackend(device="cpu", interpret=True, enforce_eager=enforce_eager)

    def record(self, stage: str, result: dict[str, Any]) -> None:
        self.results[stage] = result
        (self.out / f"{stage}.json").write_text(json.dumps(result, indent=2) + "\n")
        (self.out / "summary.md").write_text(render_summary(self.results))
        print(f"[gpu_check] {stage}: {json.dumps(result)[:400]}", flush=True)


# -- stages -----------------------------------------------------------------------------------------
def stage_env(check: Check) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "cuda": torch.version.cuda, "device": check.device}
    for name in ("triton", "transformers", "numpy"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    if not check.cpu:
        free, total = torch.cuda.mem_get_info()
        info |= {"gpu": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
                 "memory_total_gib": round(total / 2**30, 1), "memory_free_gib": round(free / 2**30, 1)}
    return info


def stage_tiny_fp32(check: Check) -> dict[str, Any]:
    import torch

    from swiftlm import LLM, SamplingParams

    path = tiny_checkpoint(check.work)
    prompts = prompts_for(check.args.seed, 4, 5, 40)
    prompts.append(prompts[0][:17] + [5, 6, 7])  # shares a prefix with the first: a prefix hit
    steps = 24
    hf = hf_model(path, torch.float32, check.device)
    expected = [hf_greedy(hf, p, steps, check.device) for p in prompts]
    del hf
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)
    # many distinct tokens: the answers depend on attention, so a wrong kernel shows
    result: dict[str, Any] = {"prompts": len(prompts), "tokens_each": steps,
                              "distinct_tokens": len({t for e in expected for t in e})}
    for mode, eager in (("graphs", False), ("eager", True)):
        llm = LLM(str(path), dtype="float32", device=check.device, backend=check.backend(eager), block_size=16,
                  max_num_seqs=8, enforce_eager=eager, num_blocks=TINY_BLOCKS)
        got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
        same = sum(g == e for g, e in zip(got, expected, strict=True))
        result[mode] = {"identical_sequences": same, "of": len(prompts), "pass": same == len(prompts),
                        "graphs_captured": getattr(llm.engine.backend, "graphs", None) is not None,
                        "backend": llm.engine.backend.describe().splitlines()}
        del llm
    result["pass"] = result["graphs"]["pass"] and result["eager"]["pass"]
    return result


def top1_agreement(check: Check, path: Path, n: int, lo: int, hi: int, steps: int, backend: Any) -> dict[str, Any]:
    """swiftlm bfloat16's most likely token after each position (its greedy answers: the decode path;
    its prompt rows: the prefill path) against transformers' in bfloat16 and in float32 over the same
    sequences, and transformers bfloat16's own agreement with its float32 (the bf16 noise floor)."""
    import torch

    from swiftlm import LLM, SamplingParams

    prompts = prompts_for(check.args.seed + 1, n, lo, hi)
    # the tiny model takes a fixed pool (its blocks are 8 KiB: a share of the device would be millions)
    sizing = {"num_blocks": TINY_BLOCKS} if path.name == "tiny" else check.engine_kwargs()
    llm = LLM(str(path), dtype="bfloat16", device=check.device, backend=backend, max_num_seqs=max(n, 2), **sizing)
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True, prompt_logprobs=1)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    del llm
    # per sequence: the ids to score, and swiftlm's top-1 after position i for each path
    seqs, ours = [], {"decode": [], "prompt": []}
    for s, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        answer = list(out.outputs[0].token_ids)
        seqs.append(prompt + answer[:-1])
        ours["decode"] += [(s, len(prompt) - 1 + j, token) for j, token in enumerate(answer)]
        for i, entry in enumerate(out.prompt_logprobs[1:]):  # entry i: the logprobs after position i
            if entry:
                ours["prompt"].append((s, i, max(entry.items(), key=lambda kv: _logprob(kv[1]))[0]))
    refs = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        hf = hf_model(path, dtype, check.device)
        refs[name] = [hf_argmax(hf, ids, check.device) for ids in seqs]  # refs[name][s][i]: after position i
        del hf
    result: dict[str, Any] = {}
    for kind, rows in ours.items():
        for name in ("bf16", "fp32"):
            result[f"{kind}_top1_vs_hf_{name}"] = sum(refs[name][s][i] == t for s, i, t in rows) / max(len(rows), 1)
        result[f"{kind}_hf_bf16_vs_hf_fp32"] = sum(refs["bf16"][s][i] == refs["fp32"][s][i]
                                                   for s, i, _ in rows) / max(len(rows), 1)
        # the positions bf16 rounding does not flip for transformers itself (its bf16 and float32
        # agree): there a miss of ours is not a near-tie (reported beside the bar, not the bar)
        stable = [(s, i, t) for s, i, t in rows if refs["bf16"][s][i] == refs["fp32"][s][i]]
        result[f"{kind}_top1_vs_hf_fp32_where_hf_bf16_agrees"] = (
            sum(refs["fp32"][s][i] == t for s, i, t in stable) / max(len(stable), 1))
        result[f"{kind}_positions"] = len(rows)
    return result


def agreement_holds(r: dict[str, Any], kind: str) -> bool:
    """The issue's bar: >= 99 % top-1 agreement with transformers bf16 (the float32 columns say how
    much of a miss is bf16 noise: transformers' own bf16 against its float32)."""
    return r[f"{kind}_top1_vs_hf_bf16"] >= 0.99


def _logprob(value: Any) -> float:
    return float(getattr(value, "logprob", value))


def stage_tiny_bf16(check: Check) -> dict[str, Any]:
    result = top1_agreement(check, tiny_checkpoint(check.work), 6, 20, 60, 32, check.backend())
    result["pass"] = agreement_holds(result, "decode") and agreement_holds(result, "prompt")
    return result


def stage_qwen3_bf16(check: Check) -> dict[str, Any]:
    n, steps = (2, 8) if check.cpu else (4, 64)
    result = top1_agreement(check, qwen3_checkpoint(check.work, 2 if check.cpu else None), n, 30, 200, steps, None)
    result["note"] = "random weights: small logit margins make bf16 ties more likely than with trained weights"
    return result


def qwen3_llm(check: Check, max_num_seqs: int, max_model_len: int, max_batched: int) -> tuple[Any, float]:
    """The engine on the Qwen3-0.6B shape, and its start time in seconds (graph capture included)."""
    from swiftlm import LLM

    path = qwen3_checkpoint(check.work, 2 if check.cpu else None)
    t0 = time.perf_counter()
    llm = LLM(str(path), dtype="bfloat16", device=check.device, max_num_seqs=max_num_seqs,
              max_model_len=max_model_len, max_num_batched_tokens=max_batched, **check.engine_kwargs())
    return llm, time.perf_counter() - t0


def stage_throughput(check: Check) -> dict[str, Any]:
    from swiftlm import SamplingParams

    n = check.args.num_seqs or (8 if check.cpu else 256)
    lo, hi = (16, 64) if check.cpu else (100, 1024)
    rng = random.Random(check.args.seed)
    prompts = [[rng.randrange(10, 150000) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
    params = [SamplingParams(temperature=0.6, max_tokens=rng.randint(lo, hi), ignore_eos=True) for _ in range(n)]
    llm, start = qwen3_llm(check, min(n, 256), 2 * hi + 64, 512 if check.cpu else 16384)
    llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=8, ignore_eos=True))  # warm-up
    default = llm.engine.async_scheduling
    runs = {}
    for overlap in (default, not default):  # the default first (the figure), then the other way, same engine
        llm.engine.async_scheduling = overlap
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        seconds = time.perf_counter() - t0
        out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        runs[overlap] = (seconds, out_tokens)
    seconds, out_tokens = runs[default]
    other_s, other_tokens = runs[not default]
    return {"sequences": n, "length_range": [lo, hi], "prompt_tokens": sum(map(len, prompts)),
            "output_tokens": out_tokens, "seconds": round(seconds, 3),
            "output_tok_per_s": round(out_tokens / seconds, 1), "engine_start_s": round(start, 2),
            "async_scheduling": default,
            "other_async_scheduling_output_tok_per_s": round(other_tokens / other_s, 1),
            "target_output_tok_per_s": 20000}


def stage_latency(check: Check) -> dict[str, Any]:
    from swiftlm import SamplingParams

    prompt_len, out_len = (32, 16) if check.cpu else (128, 128)
    llm, _ = qwen3_llm(check, 4, 2048, 2048)
    prompts = prompts_for(check.args.seed + 2, 6, prompt_len, prompt_len)
    llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(max_tokens=out_len, ignore_eos=True))  # warm-up
    ttft, total = [], []
    for p in prompts[1:]:  # distinct prompts: no prefix hits
        t0 = time.perf_counter()
        llm.generate([{"prompt_token_ids": p}], SamplingParams(max_tokens=1, ignore_eos=True))
        ttft.append(time.perf_counter() - t0)
        q = [t + 1 for t in p]
        t0 = time.perf_counter()
        llm.generate([{"prompt_token_ids": q}], SamplingParams(max_tokens=out_len, ignore_eos=True))
        total.append(time.perf_counter() - t0)
    ttft_ms = statistics.median(ttft) * 1e3
    tpot_ms = (statistics.median(total) * 1e3 - ttft_ms) / (out_len - 1)
    return {"prompt_tokens": prompt_len, "output_tokens": out_len, "ttft_ms": round(ttft_ms, 3),
            "tpot_ms": round(tpot_ms, 3), "runs": len(ttft), "target_ttft_ms": 10, "target_tpot_ms": 3}


def stage_decode16(check: Check) -> dict[str, Any]:
    from swiftlm import SamplingParams

    prompt_len, out_len = (32, 16) if check.cpu else (128, 512)
    llm, _ = qwen3_llm(check, 16, 2048, 4096)
    prompts = prompts_for(check.args.seed + 3, 16, prompt_len, prompt_len)
    params = SamplingParams(max_tokens=out_len, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=4, ignore_eos=True))
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": [t + 1 for t in p]} for p in prompts], params)
    seconds = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"sequences": 16, "prompt_tokens": prompt_len, "output_tokens_each": out_len,
            "output_tok_per_s": round(tokens / seconds, 1), "ms_per_step": round(seconds / out_len * 1e3, 3)}


STAGES: dict[str, Callable[[Check], dict[str, Any]]] = {
    "env": stage_env, "tiny_fp32": stage_tiny_fp32, "tiny_bf16": stage_tiny_bf16, "qwen3_bf16": stage_qwen3_bf16,
    "throughput": stage_throughput, "latency": stage_latency, "decode16": stage_decode16,
}


def render_summary(results: dict[str, dict[str, Any]]) -> str:
    lines = ["# swiftlm GPU check", "", "| stage | result |", "|---|---|"]
    for stage, r in results.items():
        if "error" in r:
            text = f"error: {r['error']}"
        elif stage == "tiny_fp32":
            graphs = "CUDA graphs" if r["graphs"]["graphs_captured"] else "default (no graphs captured)"
            text = f"greedy identical to transformers: {graphs} {r['graphs']['identical_sequences']}/" \
                   f"{r['graphs']['of']}, eager {r['eager']['identical_sequences']}/{r['eager']['of']}"
        elif stage in ("tiny_bf16", "qwen3_bf16"):
            text = "; ".join(
                f"{kind} ({r[f'{kind}_positions']} positions): top-1 vs transformers bf16 "
                f"{r[f'{kind}_top1_vs_hf_bf16']:.4f}, vs fp32 {r[f'{kind}_top1_vs_hf_fp32']:.4f} "
                f"(transformers bf16 vs fp32: {r[f'{kind}_hf_bf16_vs_hf_fp32']:.4f}; where those agree, ours vs fp32 "
                f"{r[f'{kind}_top1_vs_hf_fp32_where_hf_bf16_agrees']:.4f})" for kind in ("decode", "prompt"))
        elif stage == "throughput":
            text = f"{r['output_tok_per_s']} output tok/s ({r['sequences']} sequences, {r['output_tokens']} tokens " \
                   f"in {r['seconds']} s; target {r['target_output_tok_per_s']}); async scheduling " \
                   f"{'on' if r['async_scheduling'] else 'off'}, the other way {r['other_async_scheduling_output_tok_per_s']}"
        elif stage == "latency":
            text = f"TTFT {r['ttft_ms']} ms (target {r['target_ttft_ms']}), TPOT {r['tpot_ms']} ms " \
                   f"(target {r['target_tpot_ms']}), {r['prompt_tokens']} in / {r['output_tokens']} out"
        elif stage == "decode16":
            text = f"{r['output_tok_per_s']} output tok/s, {r['ms_per_step']} ms per step"
        else:
            text = ", ".join(f"{k}={v}" for k, v in r.items())
        if "pass" in r:
            text += " — pass" if r["pass"] else " — FAIL"
        lines.append(f"| {stage} | {text} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the CUDA backend's kernels on CPU tensors
    check = Check(args)
    failed = False
    for stage in args.stages.split(","):
        t0 = time.perf_counter()
        try:
            result = STAGES[stage](check)
        except Exception as exc:  # a stage that fails is reported, and the next one runs
            traceback.print_exc()
            result = {"error": f"{type(exc).__name__}: {exc}"}
        result["stage_seconds"] = round(time.perf_counter() - t0, 2)
        failed |= "error" in result or result.get("pass") is False
        check.record(stage, result)
        _free_device_memory(check)
    shutil.rmtree(check.work, ignore_errors=True)  # the random checkpoints
    return 1 if failed else 0


def _free_device_memory(check: Check) -> None:
    import gc

    gc.collect()
    if not check.cpu:
        import torch

        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
