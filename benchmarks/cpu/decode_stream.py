"""How fast batch-1 decode streams the weights, against the memory's own read rate, interleaved.

    OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores THP_MEM_ALLOC_ENABLE=1 \\
        .venv/bin/python benchmarks/cpu/decode_stream.py models/qwen3-0.6b-random --rounds 7

Each round: the read probe (``BandwidthProbe``, a 1 GiB buffer on huge pages); every linear of the served
model called once with one row, in the order a decode step calls them (the 28 layers' fused q/k/v, o,
fused gate/up, down, then the lm_head), as the engine placed them (the weight arena); then the engine's
own decode (``--decode`` tokens after a 32-token prompt). Reports GB/s of the linears' weights and of the
whole decode step (bytes of every linear weight a token), each as a fraction of the probe in the same
round, and the medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from swiftlm import LLM, SamplingParams
from swiftlm.backends.cpu.linear import GemvLinear
from swiftlm.bench.bandwidth import BandwidthProbe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--decode", type=int, default=64)
    args = ap.parse_args()
    llm = LLM(args.model)
    model = llm.engine.model
    linears = [m for m in model.modules() if isinstance(m, GemvLinear)]
    nbytes = sum(m.weight.numel() * m.weight.element_size() for m in linears)
    xs = [torch.randn(1, m.in_features).bfloat16() for m in linears]
    probe = BandwidthProbe()
    params = SamplingParams(max_tokens=args.decode, temperature=0.0, ignore_eos=True)
    g = torch.Generator().manual_seed(0)
    print(f"- {len(linears)} linears, {nbytes / 1e9:.3f} GB of weights a token")
    print("| round | probe GB/s | linears GB/s | of probe | decode tok/s | decode GB/s | of probe |\n"
          "|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    with torch.inference_mode():
        for r in range(args.rounds):
            bw = probe.measure(3)
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                for m, x in zip(linears, xs, strict=True):
                    m(x)
                times.append(time.perf_counter() - t0)
            lin = nbytes / min(times) / 1e9
            prompt = {"prompt_token_ids": torch.randint(100, 100_000, (32,), generator=g).tolist()}
            m = llm.generate([prompt], params, use_tqdm=False)[0].metrics  # decode: first token to the last
            tok_s = (args.decode - 1) / (m.finished_time - m.first_token_time)
            dec = tok_s * nbytes / 1e9
            rows.append((bw, lin, lin / bw, tok_s, dec, dec / bw))
            print(f"| {r} | {bw:.1f} | {lin:.1f} | {lin / bw:.0%} | {tok_s:.1f} | {dec:.1f} | {dec / bw:.0%} |",
                  flush=True)
    med = [statistics.median(c) for c in zip(*rows, strict=True)]
    print(f"| median | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.0%} | {med[3]:.1f} | {med[4]:.1f} | {med[5]:.0%} |")


if __name__ == "__main__":
    main()
