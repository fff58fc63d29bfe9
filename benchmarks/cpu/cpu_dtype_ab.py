"""Decode speed and time to first token of one model in several dtypes, interleaved in one process: what
``--dtype auto`` should pick on a CPU.

    OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores THP_MEM_ALLOC_ENABLE=1 \\
        .venv/bin/python benchmarks/cpu/cpu_dtype_ab.py models/qwen3-0.6b-random --dtypes bfloat16 float32

On an AVX-512 CPU, ``SWIFTLM_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` in the
environment runs everything as on an AVX2 CPU (swiftlm's kernels built without AVX-512, torch's and
oneDNN's own code held to AVX2). One engine per dtype, each with a pool of ``--num-blocks`` blocks
written once before timing (a VM can charge milliseconds a MB for memory touched the first time). Each
repeat times, engine by engine in an order that reverses every repeat: decode (``--decode`` tokens
after a 32-token prompt, less that prompt's TTFT) and the TTFT of a fresh prompt of each ``--prompts``
length. Prints medians and each dtype's ratio to the first, with the bandwidth probe's median.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from swiftlm import LLM, SamplingParams
from swiftlm.bench.bandwidth import BandwidthProbe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--prompts", type=int, nargs="*", default=[512])
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-blocks", type=int, default=0, help="KV blocks an engine (0: enough for the prompts)")
    args = ap.parse_args()
    blocks = args.num_blocks or 2 * (max([32, *args.prompts]) + args.decode + 64) // 16 + 8
    engines = {}
    for dtype in args.dtypes:
        llm = LLM(args.model, dtype=dtype, num_blocks=blocks)
        k_pools, v_pools = llm.engine.kv_cache.pools()
        for pool in (*k_pools, *v_pools):
            pool.zero_()
        engines[dtype] = llm
        print(f"- {dtype}: {'; '.join(llm.engine.backend.plan)}", flush=True)
    g = torch.Generator().manual_seed(1)

    def prompt(n: int) -> dict:
        return {"prompt_token_ids": torch.randint(100, 100_000, (n,), generator=g).tolist()}

    def run(llm: LLM, p: dict, tokens: int) -> float:
        t0 = time.perf_counter()
        llm.generate([p], SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True), use_tqdm=False)
        return time.perf_counter() - t0

    for llm in engines.values():  # warm: every matmul's row count once
        run(llm, prompt(max([32, *args.prompts])), 4)
    probe = BandwidthProbe()
    decode: dict[str, list[float]] = {d: [] for d in engines}
    ttft: dict[tuple[str, int], list[float]] = {(d, n): [] for d in engines for n in args.prompts}
    seen: list[float] = []
    for r in range(args.repeats):
        seen.append(probe.measure(3))
        prompts = {n: prompt(n) for n in args.prompts}
        short = prompt(32)
        for dtype in list(engines) if r % 2 == 0 else list(engines)[::-1]:
            llm = engines[dtype]
            first = run(llm, short, 1)
            decode[dtype].append(args.decode / (run(llm, short, args.decode + 1) - first))
            for n, p in prompts.items():
                ttft[(dtype, n)].append(run(llm, p, 1))
    base = args.dtypes[0]
    print(f"- bandwidth probe: median {statistics.median(seen):.1f} GB/s ({min(seen):.1f}-{max(seen):.1f})")
    header = "| dtype | decode tok/s | vs " + base + " |" + "".join(f" TTFT {n} s | vs {base} |" for n in args.prompts)
    print(header + "\n|---|" + "---:|" * (2 + 2 * len(args.prompts)))
    for dtype in engines:
        dec = statistics.median(decode[dtype])
        row = f"| {dtype} | {dec:.2f} | {dec / statistics.median(decode[base]):.2f}x |"
        for n in args.prompts:
            t = statistics.median(ttft[(dtype, n)])
            row += f" {t:.2f} | {statistics.median(ttft[(base, n)]) / t:.2f}x |"
        print(row, flush=True)


if __name__ == "__main__":
    main()
