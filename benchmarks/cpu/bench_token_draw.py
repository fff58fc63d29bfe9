"""A step's tokens from its logits on the CPU: the one-pass op (``token_draw_cpu.cpp``) against the torch
ops it replaced (``runner.sampler.sample_on_device`` and the finiteness check), and the greedy pick, at
two shapes: 16 rows of Qwen3's 151,936-token vocabulary and 256 rows of 4,096.

    python benchmarks/cpu/bench_token_draw.py [--repeats 30]

Prints ms a step for each, interleaved (kernel, torch, kernel, torch), and their ratio."""

from __future__ import annotations

import argparse
import math
import statistics
import time
from functools import partial

import torch

from swiftlm import SamplingParams
from swiftlm.backends.cpu.kernels.fused_cpu import load_fused_ops
from swiftlm.backends.cpu.kernels.token_draw_cpu import load_token_draw
from swiftlm.runner.sampler import sample_on_device
from swiftlm.runner.sampling_row import SamplingRow


def timed(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def torch_draw(x: torch.Tensor, rows: list[SamplingRow]) -> tuple[torch.Tensor, torch.Tensor]:
    return sample_on_device(x, rows), torch.isfinite(x.sum(-1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--temperature", type=float, default=0.7)
    args = p.parse_args()
    draw, ops = load_token_draw(), load_fused_ops()
    assert draw is not None and ops is not None, "the CPU kernels did not build"
    print(f"threads {torch.get_num_threads()}, temperature {args.temperature}")
    for rows, vocab in ((16, 151936), (256, 4096)):
        x = torch.randn(rows, vocab)
        sampled = [SamplingRow(SamplingParams(temperature=args.temperature), [1], [], None) for _ in range(rows)]
        t, lp = torch.full((rows,), args.temperature), torch.full((rows,), -math.inf)
        u = torch.rand(rows)
        kernel, plain = [], []
        for _ in range(2):
            kernel.append(timed(partial(draw, x, t, lp, u), args.repeats))
            plain.append(timed(partial(torch_draw, x, sampled), args.repeats))
        greedy = timed(partial(draw, x, torch.zeros(rows), lp, u), args.repeats)
        pick = timed(partial(ops.greedy_pick, x), args.repeats)
        k, q = statistics.median(kernel), statistics.median(plain)
        print(f"{rows} x {vocab}: sampled {k:.3f} ms (torch {q:.3f} ms, {q / k:.2f}x); greedy {greedy:.3f} ms "
              f"({greedy / rows * 1e3:.2f} us a row), greedy_pick {pick:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
