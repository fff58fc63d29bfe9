"""The bf16 GEMM for prefill rows (AVX-512 CPUs without AMX; on AVX2 CPUs the float32 GEMM of the bf16
linear kernel) against torch, interleaved in one process.

    OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores THP_MEM_ALLOC_ENABLE=1 \\
        .venv/bin/python benchmarks/cpu/gemm_ab.py --flops ../shared/tools/flops.c \\
        --model models/qwen3-0.6b-random --prompts 512 2048 --rounds 3

* **kernels**: GFLOP/s of each arithmetic the GEMM holds and of ``F.linear`` (oneDNN) on the Qwen3-0.6B
  linears (q/k/v fused, o, gate/up fused, down) at ``--rows``, the three in turn for ``--rounds`` rounds,
  medians; with ``--flops`` (the register-only probe ``flops.c``, compiled here with gcc) each figure is
  also a fraction of the peak of the arithmetic it runs on. ``F.linear f32`` is oneDNN on the same values
  in float32 (what a float32 model runs). On a CPU without AVX-512 the table has one arithmetic,
  ``fma32-avx2`` (``bf16_linear_cpu``: calls of 16 rows or more widen the weights to float32 in
  registers), and no TTFT rounds.
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
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from swiftlm import LLM
from swiftlm.backends.cpu.kernels.bf16_linear_cpu import load_bf16_gemv
from swiftlm.backends.cpu.kernels.gemm_cpu import (
    ARITHMETICS as ARITHMETIC_OPS,
)
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
PEAK_NAMES = {"dpbf16": "vdpbf16ps", "fma32": r"float32 FMA \(zmm", "fma32-avx2": r"float32 FMA \(ymm"}


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
        found = re.search(name + r".*?([\d.]+) GFLOP/s", out)
        if found:
            peaks[arith] = float(found.group(1))
    return peaks


def kernel_rounds(rows: list[int], rounds: int, peaks: dict[str, float], ops: dict[str, Callable]) -> None:
    """``ops``: arithmetic -> op(x [M, K] bf16, w [N, K] bf16), timed in turn with ``F.linear`` on the
    same bf16 values and on their float32 copies."""
    arith = list(ops)
    print("| rows | linear | F.linear | F.linear f32 | " + " | ".join(arith) + " | best / F.linear | best / f32 |")
    print("|---:|---|---:|---:|" + "---:|" * len(arith) + "---:|---:|")
    for m in rows:
        for name, (n, k) in SHAPES.items():
            x, w = torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16()
            fns = {"F.linear": partial(F.linear, x, w), "F.linear f32": partial(F.linear, x.float(), w.float())}
            fns |= {a: partial(op, x, w) for a, op in ops.items()}
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
            # AVX-512: calls of up to small_call_rows() rows run on vdpbf16ps whichever arithmetic is asked
            small = small_call_rows() if "dpbf16" in ops else 0
            ran = {a: "dpbf16" if a in ARITHMETIC_OPS and m <= small else a for a in arith}
            cells = [f"{med[a]:.0f}" + (f" ({med[a] / peaks[ran[a]]:.0%}{'' if ran[a] == a else ' dpbf16'})"
                                        if ran[a] in peaks else "") for a in arith]
            best = max(med[a] for a in arith)
            print(f"| {m} | {name} | {med['F.linear']:.0f} | {med['F.linear f32']:.0f} | " + " | ".join(cells)
                  + f" | {best / med['F.linear']:.2f}x | {best / med['F.linear f32']:.2f}x |", flush=True)


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
    if chosen is not None:
        ops = {a: gemm_op(a) for a in available_arithmetics()}
        choice = chosen.describe()
    else:  # no AVX-512: the bf16 linear kernel's float32 GEMM (AVX2 + FMA)
        gemv = load_bf16_gemv()
        if gemv is None:
            raise SystemExit("neither the AVX-512 GEMM nor the AVX2 bf16 linear kernel loads on this CPU")
        ops, choice = {"fma32-avx2": gemv}, "the AVX2 bf16 linear kernel (float32 GEMM from 16 rows)"
    print(f"- bandwidth probe: {BandwidthProbe().measure(3):.1f} GB/s; GEMM: {choice}")
    peaks = flops_peaks(args.flops) if args.flops else {}
    if args.rows:
        kernel_rounds(args.rows, args.rounds, peaks, ops)
    if args.model and chosen is not None:
        print("| weights | prompt | TTFT oneDNN s | TTFT GEMM s | speed-up |\n|---|---:|---:|---:|---:|")
        for q in [None, *args.quantization]:
            ttft_rounds(args.model, args.prompts, args.rounds, q)


if __name__ == "__main__":
    main()
