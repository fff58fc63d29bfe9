"""Time to first token of long prompts with the CPU's paged prefill attention kernel against the torch
path it replaces (gather + SDPA), and the attention calls alone, interleaved in one process.

    OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores THP_MEM_ALLOC_ENABLE=1 \\
        .venv/bin/python benchmarks/cpu/bench_prefill.py models/qwen3-0.6b-random --prompts 512 2048 --rounds 3

* **TTFT**: two engines on one model (``--dtype``, ``--kv-cache-dtype``), one with every CPU kernel and
  one with ``cpu_disable_kernels=["prefill_attention"]``; each round sends each engine the same fresh
  random prompt (no prefix hit), in alternating order, and times ``generate(max_tokens=1)``. Each engine
  has a pool of two longest prompts' blocks with every page written before the rounds, and prefills
  one prompt of the longest length first (a fresh pool's first touch is timed otherwise: on a VM,
  first-touched memory can cost milliseconds a MB).
* **attention** (``--contexts``): one call of the op on a chunk of ``--chunk`` rows at the end of a
  context of that many tokens (Qwen3-0.6B's heads, pools of ``--dtype``, shuffled blocks of 16), against
  ``causal_attention`` over the gathered context, alternating, medians of ``--rounds`` x 5 calls.
  ``--avx2`` times the AVX2 build of the kernel (on an AVX-512 CPU; run with ``ATEN_CPU_CAPABILITY=avx2``
  so that torch's side takes its AVX2 code too): float32 on a CPU without AVX-512.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from swiftlm import LLM
from swiftlm.backends.attention import causal_attention
from swiftlm.backends.cpu.kernels.prefill_attention_cpu import load_build_variant, load_prefill_attention
from swiftlm.bench.bandwidth import BandwidthProbe
from swiftlm.bench.ttft_ab import prefaulted, ttft_ab

HQ, HKV, D, BS = 16, 8, 128, 16


def attention_rounds(contexts: list[int], chunk: int, rounds: int, dtype: torch.dtype, avx2: bool) -> None:
    op = load_build_variant("swiftlm_prefill_attention_avx2", ("-mno-avx512f",)) if avx2 else load_prefill_attention()
    if op is None:
        raise SystemExit("the prefill attention kernel does not load on this CPU")
    g = torch.Generator().manual_seed(0)
    for ctx in contexts:
        n = (ctx + BS - 1) // BS
        k_pool = torch.randn(n + 4, BS, HKV, D, generator=g).to(dtype)
        v_pool = torch.randn(n + 4, BS, HKV, D, generator=g).to(dtype)
        table = torch.randperm(n + 4, generator=g)[:n]
        q = torch.randn(min(chunk, ctx), HQ, D, generator=g).to(dtype)

        def kernel(q=q, k_pool=k_pool, v_pool=v_pool, table=table, ctx=ctx) -> torch.Tensor:
            return op(q, k_pool, v_pool, table, ctx, D ** -0.5)

        def torch_path(q=q, k_pool=k_pool, v_pool=v_pool, table=table, ctx=ctx) -> torch.Tensor:
            k = k_pool[table].view(-1, HKV, D)[:ctx]
            v = v_pool[table].view(-1, HKV, D)[:ctx]
            return causal_attention(q, k, v)

        times: dict[str, list[float]] = {"kernel": [], "torch": []}
        for r in range(rounds):
            pair = (("kernel", kernel), ("torch", torch_path))
            for name, fn in pair if r % 2 == 0 else pair[::-1]:
                for _ in range(5):
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t0)
        t_k, t_t = statistics.median(times["kernel"]), statistics.median(times["torch"])
        t = q.shape[0]
        flops = 4 * HQ * D * t * (ctx - t + (t + 1) / 2)  # q.k and P.V over each row's keys
        print(f"| {ctx} | {t} | {t_t * 1e3:.1f} | {t_k * 1e3:.1f} | {t_t / t_k:.2f}x | {flops / t_k / 1e9:.0f} |", flush=True)


def ttft_rounds(model: str, dtype: str, kv: str, prompts: list[int], rounds: int) -> None:
    blocks = 2 * (max(prompts) + 64) // 16 + 8  # two prompts' blocks: the pool cycles through pages already in
    engines = {"kernel": prefaulted(LLM(model, dtype=dtype, kv_cache_dtype=kv, num_blocks=blocks)),
               "sdpa": prefaulted(LLM(model, dtype=dtype, kv_cache_dtype=kv, num_blocks=blocks,
                                      cpu_disable_kernels=["prefill_attention"]))}
    for n, med in ttft_ab(engines, prompts, rounds).items():
        a, b = med["sdpa"], med["kernel"]
        print(f"| {dtype} | {kv} | {n} | {a:.2f} | {b:.2f} | {a / b:.2f}x |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help="a model directory for the TTFT rounds (none: attention only)")
    ap.add_argument("--prompts", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--kv-cache-dtypes", nargs="+", default=["auto"])
    ap.add_argument("--contexts", type=int, nargs="*", default=[512, 2048, 8192])
    ap.add_argument("--chunk", type=int, default=512, help="query rows of the attention calls (a prefill chunk)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="q, the pools and the model")
    ap.add_argument("--avx2", action="store_true", help="the attention calls on the kernel's AVX2 build")
    args = ap.parse_args()
    print(f"- bandwidth probe: {BandwidthProbe().measure(3):.1f} GB/s")
    if args.contexts:
        print("| context | rows | torch path ms | kernel ms | speed-up | kernel GFLOP/s |\n|---:|---:|---:|---:|---:|---:|")
        attention_rounds(args.contexts, args.chunk, args.rounds, getattr(torch, args.dtype), args.avx2)
    if args.model:
        print("| dtype | kv cache | prompt | TTFT gather + SDPA s | TTFT kernel s | speed-up |\n"
              "|---|---|---:|---:|---:|---:|")
        for kv in args.kv_cache_dtypes:
            ttft_rounds(args.model, args.dtype, kv, args.prompts, args.rounds)


if __name__ == "__main__":
    main()
