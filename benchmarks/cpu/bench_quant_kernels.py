"""Time Qwen3-0.6B's linear layers: bf16, PyTorch's int8/int4 weight-only ops and swiftlm's kernels.

Random weights of the real shape (speed does not depend on the values):

    python benchmarks/cpu/bench_quant_kernels.py [--layers 28] [--rounds 7] [--threads N] [--json out.json]

* decode: one token through all layers' q/k/v/o/gate/up/down and the lm_head (197 calls), M rows
  (1, 4 and 16), as ``F.linear`` on bf16 weights, ``aten._weight_int8pack_mm``,
  ``aten._weight_int4pack_mm_for_cpu`` (groups of 64), and swiftlm's ``QuantLinear`` int8 / int4.
  The ways run interleaved, round after round, each pass bracketed by a read-bandwidth probe
  (this machine's bandwidth drifts by 1.6x); reported: the best pass, GB/s of weight bytes streamed,
  and that as a fraction of the probe's bandwidth next to it.
* prefill: M = 512 rows through one layer's seven linears and through one 1024 -> 3072 linear,
  bf16 ``F.linear`` vs ``QuantLinear`` (fake-quantised activations, weights dequantised to bf16).
* crossover: one 1024 -> 3072 linear at M = 16..256 on the GEMV kernel and on the dense path.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from swiftlm.backends.cpu.kernels.quant_cpu import load_quant_kernels
from swiftlm.backends.cpu.limits import QUANT_GEMV_ROWS
from swiftlm.backends.quant import INT4_GROUP, QuantLinear, quantize_weight_int4, quantize_weight_int8

HIDDEN, INTERMEDIATE, Q_SIZE, KV_SIZE, VOCAB = 1024, 3072, 2048, 1024, 151936
LAYER = [(Q_SIZE, HIDDEN), (KV_SIZE, HIDDEN), (KV_SIZE, HIDDEN), (HIDDEN, Q_SIZE),
         (INTERMEDIATE, HIDDEN), (INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)]  # (N, K)


class Probe:
    """Read bandwidth of a 256 MiB buffer on torch's threads, best of a few passes (GB/s)."""

    def __init__(self) -> None:
        self.buf = torch.ones(64 << 20)

    def __call__(self, passes: int = 3) -> float:
        best = min(_time(lambda: self.buf.sum()) for _ in range(passes))
        return self.buf.numel() * 4 / best / 1e9


def _time(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def random_quant_linear(method: str, n: int, k: int, kernels) -> QuantLinear:
    tiles = -(-n // 16)
    if method == "int8":
        return QuantLinear("int8", k, n, torch.randint(1, 256, (tiles, k // 4, 64), dtype=torch.uint8),
                           torch.rand(n) * 1e-3, kernels=kernels, kernel_max_rows=QUANT_GEMV_ROWS)
    groups = k // INT4_GROUP
    return QuantLinear("int4", k, n, torch.randint(0, 256, (tiles, k // 32, 4, 64), dtype=torch.uint8),
                       (torch.rand(tiles, groups, 16) * 1e-2).half(), (torch.rand(tiles, groups, 16) * -0.1).half(),
                       kernels=kernels, kernel_max_rows=QUANT_GEMV_ROWS)


def build_ways(shapes: list[tuple[int, int]], kernels) -> dict[str, tuple[Callable[[dict], None], int]]:
    """name -> (run one token given {K: activations}, weight bytes streamed per token)."""
    ways: dict[str, tuple[Callable[[dict], None], int]] = {}
    bf16 = [torch.randn(n, k, dtype=torch.bfloat16) for n, k in shapes]
    ways["bf16 F.linear"] = (lambda x: [F.linear(x[w.shape[1]], w) for w in bf16], sum(w.numel() * 2 for w in bf16))
    i8 = [(torch.randint(-127, 128, (n, k), dtype=torch.int8), torch.rand(n, dtype=torch.bfloat16)) for n, k in shapes]
    ways["aten int8pack"] = (lambda x: [torch.ops.aten._weight_int8pack_mm(x[q.shape[1]], q, s) for q, s in i8],
                             sum(q.numel() + s.numel() * 2 for q, s in i8))
    i4 = []
    for n, k in shapes:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (n, k), dtype=torch.int32), 1)
        i4.append((packed, torch.rand(k // INT4_GROUP, n, 2, dtype=torch.bfloat16), k))
    ways["aten int4pack g64"] = (
        lambda x: [torch.ops.aten._weight_int4pack_mm_for_cpu(x[k], p, INT4_GROUP, sz) for p, sz, k in i4],
        sum(p.numel() * p.element_size() + sz.numel() * 2 for p, sz, _ in i4))
    if kernels is not None:
        for method in ("int8", "int4"):
            layers = [random_quant_linear(method, n, k, kernels) for n, k in shapes]
            nbytes = sum(b.numel() * b.element_size() for layer in layers for _, b in layer.named_buffers())
            ways[f"swiftlm {method}"] = (lambda x, layers=layers: [layer(x[layer.in_features]) for layer in layers], nbytes)
    return ways


def bench_decode(ways, rows: int, rounds: int, probe: Probe, only: tuple[str, ...] = ()) -> list[dict]:
    x = {k: torch.randn(rows, k, dtype=torch.bfloat16) for k in (HIDDEN, Q_SIZE, INTERMEDIATE)}
    names = [n for n in ways if not only or n in only]
    for name in names:
        ways[name][0](x)  # warm-up
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):  # A B C, C B A, ...
            bw = probe()
            times[name].append((_time(lambda run=ways[name][0]: run(x)), bw))
    out = []
    for name in names:
        t, bw = min(times[name])
        nbytes = ways[name][1]
        out.append({"way": name, "rows": rows, "ms": t * 1e3, "GB": nbytes / 1e9, "GB/s": nbytes / t / 1e9,
                    "probe GB/s": bw, "of probe": nbytes / t / 1e9 / bw})
    return out


def bench_prefill(kernels, rounds: int, rows: int = 512) -> list[dict]:
    out = []
    for label, shapes in (("one layer's 7 linears", LAYER), ("1024->3072", [(INTERMEDIATE, HIDDEN)])):
        dense = [torch.randn(n, k, dtype=torch.bfloat16) for n, k in shapes]
        x = {k: torch.randn(rows, k, dtype=torch.bfloat16) for k in (HIDDEN, Q_SIZE, INTERMEDIATE)}
        runs = {"bf16 F.linear": lambda x=x, dense=dense: [F.linear(x[w.shape[1]], w) for w in dense]}
        for method in ("int8", "int4"):
            layers = [random_quant_linear(method, n, k, kernels) for n, k in shapes]
            runs[f"swiftlm {method}"] = lambda x=x, layers=layers: [layer(x[layer.in_features]) for layer in layers]
        best = {name: min(_time(fn) for _ in range(rounds)) for name, fn in runs.items()}
        for name, t in best.items():
            flops = 2 * rows * sum(n * k for n, k in shapes)
            out.append({"prefill": label, "rows": rows, "way": name, "ms": t * 1e3, "TFLOP/s": flops / t / 1e12,
                        "vs bf16": t / best["bf16 F.linear"]})
    return out


def bench_crossover(kernels, rounds: int) -> list[dict]:
    out = []
    for method in ("int8", "int4"):
        gemv = random_quant_linear(method, INTERMEDIATE, HIDDEN, kernels)
        dense = random_quant_linear(method, INTERMEDIATE, HIDDEN, kernels)
        gemv.kernel_max_rows, dense.kernel_max_rows = 1 << 30, 0  # force one path each
        for rows in (16, 32, 64, 128, 256):
            x = torch.randn(rows, HIDDEN, dtype=torch.bfloat16)
            t_gemv = min(_time(lambda x=x, f=gemv: f(x)) for _ in range(rounds))
            t_dense = min(_time(lambda x=x, f=dense: f(x)) for _ in range(rounds))
            out.append({"crossover": method, "rows": rows, "gemv ms": t_gemv * 1e3, "dense ms": t_dense * 1e3})
    return out


def bench_quantisation() -> list[dict]:
    """Time to quantise one decoder layer's weights (bf16 in), to extrapolate a model's load time."""
    weights = [torch.randn(n, k, dtype=torch.bfloat16) for n, k in LAYER]
    count = sum(w.numel() for w in weights)
    out = []
    for method, fn in (("int8", quantize_weight_int8), ("int4", lambda w: quantize_weight_int4(w, INT4_GROUP))):
        t = _time(lambda fn=fn: [fn(w) for w in weights])
        out.append({"quantise": method, "weights": count, "s": t, "s per 596M weights": t * 596e6 / count})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    kernels = load_quant_kernels()
    print(f"threads {torch.get_num_threads()}, swiftlm kernels {'loaded' if kernels else 'UNAVAILABLE'}")
    probe = Probe()
    shapes = LAYER * args.layers + [(VOCAB, HIDDEN)]
    t0 = time.perf_counter()
    ways = build_ways(shapes, kernels)
    print(f"built {len(ways)} ways of {len(shapes)} linears in {time.perf_counter() - t0:.0f} s")
    results: list[dict] = []
    with torch.inference_mode():
        for row in bench_decode(ways, 1, args.rounds, probe):
            results.append(row)
            print(f"decode M=1  {row['way']:18s} {row['ms']:7.2f} ms/token  {row['GB']:.3f} GB  "
                  f"{row['GB/s']:5.1f} GB/s  ({row['of probe']:.0%} of probe {row['probe GB/s']:.0f} GB/s)")
        batched = ("bf16 F.linear", "swiftlm int8", "swiftlm int4")
        for rows in (4, 16):
            for row in bench_decode(ways, rows, max(3, args.rounds // 2), probe, only=batched):
                results.append(row)
                print(f"decode M={rows:<2d} {row['way']:18s} {row['ms']:7.2f} ms/step")
        del ways
        if kernels is not None:
            for row in bench_prefill(kernels, args.rounds):
                results.append(row)
                print(f"prefill M={row['rows']} {row['prefill']:22s} {row['way']:14s} {row['ms']:7.2f} ms  "
                      f"{row['TFLOP/s']:.2f} TFLOP/s  {row['vs bf16']:.2f}x bf16 time")
            for row in bench_crossover(kernels, args.rounds):
                results.append(row)
                print(f"1024->3072 {row['crossover']} M={row['rows']:<3d} gemv {row['gemv ms']:.2f} ms  "
                      f"dense {row['dense ms']:.2f} ms")
    for row in bench_quantisation():
        results.append(row)
        print(f"quantise {row['quantise']}: {row['s'] * 1e3:.0f} ms per layer "
              f"({row['s per 596M weights']:.1f} s for Qwen3-0.6B's 596M linear weights)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
