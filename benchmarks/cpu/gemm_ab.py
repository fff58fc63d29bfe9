"""The bf16 GEMM for prefill rows (AVX-512 CPUs without AMX) against torch, interleaved in one process.

    OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores THP_MEM_ALLOC_ENABLE=1 \\
        .venv/bin/python benchmarks/cpu/gemm_ab.py --flops ../shared/tools/flops.c \\
        --model models/qwen3-0.6b-random --prompts 512 2048 --rounds 3

* **kernels**: GFLOP/s of each arithmetic the GEMM holds and of ``F.linear`` (oneDNN) on the Qwen3-0.6B
  linears (q/k/v fused, o, gate/up fused, down) at ``--rows``, the three in turn for ``--rounds`` rounds,
  medians; with ``--flops`` (the register-only probe ``flops.c``, compiled here with gcc) each figure is
  also a fraction of the peak of the arithmetic it runs on.
* **TTFT** (``--model``): one engine with every CPU kernel and one with ``cpu_disable_kernels=["gemm"]``
  (the rows go to oneDNN as before), each given the same fresh random prompt in alternating order,
  ``generate(max_tokens=1)`` timed; ``--quantization`` adds a pair for each method.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from swiftlm import LLM
from swiftlm.backends.cpu.kernels.gemm_cpu import (
    available_arithmetics,
    gemm_op,
    load_bf16_gemm,
    small_call_rows,
)
from swiftlm.bench.bandwidth import BandwidthProbe
from swiftlm.bench.ttft_ab import prefaulted, ttft_ab
from swiftlm.threads import all_cpus

SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}  # (N, K)
PEAK_NAMES = {"dpbf16": "vdpbf16ps", "fma32": "float32 FMA"}


def flops_peaks(source: str) -> dict[str, float]:
    """GFLOP/s per arithmetic as ``flops.c`` prints them (``name   123 GFLOP/s`` lines)."""
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "flops"
        subprocess.run(["gcc", "-O2", "-march=native", "-fopenmp", source, "-o", str(binary)], check=True)
        with all_cpus():  # not the one core OpenMP bound this process's main thread to
            out = subprocess.run([str(binary)], capture_output=True, text=True, check=True,
                                 env={**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}).stdout
    print("```\n" + out.strip() + "\n```")
    peaks = {}
    for arith, name in PEAK_NAMES.items():
        found = re.search(re.escape(name) + r".*?([\d.]+) GFLOP/s", out)
        if found:
            peaks[arith] = float(found.group(1))
    return peaks


def kernel_rounds(rows: list[int], rounds: int, peaks: dict[str, float]) -> None:
    arith = available_arithmetics()
    print("| rows | linear | F.linear | " + " | ".join(arith) + " | best / F.linear |")
    print("|---:|---|---:|" + "---:|" * len(arith) + "---:|")
    for m in rows:
        for name, (n, k) in SHAPES.items():
            x, w = torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16()
            fns = {"F.linear": partial(F.linear, x, w)} | {a: partial(gemm_op(a), x, w) for a in arith}
            reps = max(3, int(4e9 / (2 * m * n * k)))
            rates: dict[str, list[float]] = {f: [] for f in fns}
            for _ in range(rounds):
                for f, fn in fns.items():
                    fn()
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        fn()
                    rates[f].append(2 * m * n * k * reps / (time.perf_counter() - t0) / 1e9)
            med = {f: statistics.median(v) for f, v in rates.items()}
            # calls of up to small_call_rows() rows run on vdpbf16ps whichever arithmetic is asked
            ran = {a: "dpbf16" if m <= small_call_rows() else a for a in arith}
            cells = [f"{med[a]:.0f}" + (f" ({med[a] / peaks[ran[a]]:.0%}{'' if ran[a] == a else ' dpbf16'})"
                                        if ran[a] in peaks else "") for a in arith]
            best = max(med[a] for a in arith)
            print(f"| {m} | {name} | {med['F.linear']:.0f} | " + " | ".join(cells) + f" | {best / med['F.linear']:.2f}x |",
                  flush=True)


def ttft_rounds(model: str, prompts: list[int], rounds: int, quantization: str | None) -> None:
    blocks = 2 * (max(prompts) + 64) // 16 + 8
    engines = {"gemm": prefaulted(LLM(model, num_blocks=blocks, quantization=quantization)),
               "oneDNN": prefaulted(LLM(model, num_blocks=blocks, quantization=quantization,
                                        cpu_disable_kernels=["gemm"]))}
    for n, med in ttft_ab(engines, prompts, rounds).items():
        a, b = med["oneDNN"], med["gemm"]
        print(f"| {quantization or 'bf16'} | {n} | {a:.3f} | {b:.3f} | {a / b:.2f}x |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="*", default=[16, 128, 512])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--flops", help="path of flops.c (the register-only peak probe)")
    ap.add_argument("--model", help="a model directory for the TTFT rounds")
    ap.add_argument("--prompts", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--quantization", nargs="*", default=[], choices=["int8", "int4"])
    args = ap.parse_args()
    chosen = load_bf16_gemm()
    if chosen is None:
        raise SystemExit("the bf16 GEMM does not load on this CPU (it needs AVX-512)")
    print(f"- bandwidth probe: {BandwidthProbe().measure(3):.1f} GB/s; load-time choice: {chosen.describe()}")
    peaks = flops_peaks(args.flops) if args.flops else {}
    if args.rows:
        kernel_rounds(args.rows, args.rounds, peaks)
    if args.model:
        print("| weights | prompt | TTFT oneDNN s | TTFT GEMM s | speed-up |\n|---|---:|---:|---:|---:|")
        for q in [None, *args.quantization]:
            ttft_rounds(args.model, args.prompts, args.rounds, q)


if __name__ == "__main__":
    main()
