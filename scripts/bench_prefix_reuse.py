"""Time to first token of a chat's next turn without a session, per KV block size.

    OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores .venv/bin/python scripts/bench_prefix_reuse.py \\
        models/qwen3-0.6b-random --kv-cache-dtype int8 --block-sizes 16 32

A client that keeps no session sends the whole history again each turn (the openai SDK does): the
engine then reuses what its prefix cache holds of it. Per case, one engine per block size computes a
prompt of 300-369 tokens (one token generated), then the same prompt with ``--new`` tokens more:
the second request's time to first token is timed, the block sizes alternating which goes first.
Prints medians and the per-case ratio to the first block size.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from swiftlm import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--block-sizes", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--new", type=int, default=40, help="tokens the next turn adds")
    ap.add_argument("--cases", type=int, default=12)
    args = ap.parse_args()
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    engines = {bs: LLM(args.model, dtype="bfloat16", kv_cache_dtype=args.kv_cache_dtype, block_size=bs,
                       kv_cache_memory=1 << 30) for bs in args.block_sizes}
    g = torch.Generator().manual_seed(1)
    ttft: dict[int, list[float]] = {bs: [] for bs in args.block_sizes}
    cached: dict[int, list[int]] = {bs: [] for bs in args.block_sizes}
    for case in range(args.cases):
        first = torch.randint(0, 150000, (300 + case * 6,), generator=g).tolist()
        turn = first + torch.randint(0, 150000, (args.new,), generator=g).tolist()
        order = args.block_sizes if case % 2 == 0 else args.block_sizes[::-1]
        for bs in order:
            llm = engines[bs]
            llm.generate([{"prompt_token_ids": first}], one)
            t0 = time.perf_counter()
            for out in llm.stream({"prompt_token_ids": turn}, one):
                if out.outputs and out.outputs[0].token_ids:
                    ttft[bs].append(time.perf_counter() - t0)
                    cached[bs].append(out.num_cached_tokens)
                    break
    base = args.block_sizes[0]
    for bs in args.block_sizes:
        ratio = statistics.median(b / a for a, b in zip(ttft[base], ttft[bs], strict=True))
        reused = statistics.mean(c / (300 + i * 6) for i, c in enumerate(cached[bs]))
        print(f"blocks of {bs}: next turn's TTFT median {statistics.median(ttft[bs]) * 1e3:.1f} ms "
              f"(x{ratio:.3f} of blocks of {base}), {reused:.1%} of the earlier prompt reused")


if __name__ == "__main__":
    main()
