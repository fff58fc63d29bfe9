"""Time to first token of a chat's next turn without a session: prefix reuse exact to the token
against whole blocks only, per KV block size.

    OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores .venv/bin/python benchmarks/engine/bench_prefix_reuse.py \\
        models/qwen3-0.6b-random --kv-cache-dtype int8 --block-sizes 16 32

A client that keeps no session sends the whole history again each turn (the openai SDK does): the
engine then reuses what its prefix cache holds of it. Per case, every engine computes a prompt of
300 + 6 x case tokens (one token generated), then the same prompt with ``--new`` tokens more, whose
time to first token is timed; the engines take turns, the order alternating. "whole blocks" is the
same engine with the copy of the block a match ends inside turned off (reuse stops at the last whole
block, as vLLM's prefix cache does). Prints medians and the share of the earlier prompt reused.
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
    engines: dict[str, LLM] = {}
    for bs in args.block_sizes:
        for reuse in ("exact", "whole blocks"):
            llm = LLM(args.model, dtype="bfloat16", kv_cache_dtype=args.kv_cache_dtype, block_size=bs,
                      kv_cache_memory=1 << 30)
            if reuse == "whole blocks":
                llm.engine.kv.prefix_cache.match_partial = lambda *a, **k: None  # this engine only
            engines[f"blocks of {bs}, {reuse}"] = llm
    g = torch.Generator().manual_seed(1)
    ttft: dict[str, list[float]] = {name: [] for name in engines}
    share: dict[str, list[float]] = {name: [] for name in engines}
    names = list(engines)
    for case in range(args.cases):
        first = torch.randint(0, 150000, (300 + 6 * case,), generator=g).tolist()
        turn = first + torch.randint(0, 150000, (args.new,), generator=g).tolist()
        for name in names if case % 2 == 0 else names[::-1]:
            llm = engines[name]
            llm.generate([{"prompt_token_ids": first}], one)
            t0 = time.perf_counter()
            for out in llm.stream({"prompt_token_ids": turn}, one):
                if out.outputs and out.outputs[0].token_ids:
                    ttft[name].append(time.perf_counter() - t0)
                    share[name].append(out.num_cached_tokens / len(first))
                    break
    print(f"next turn of {args.new} new tokens after a {args.kv_cache_dtype} prompt of 300-{300 + 6 * (args.cases - 1)}, "
          f"{args.cases} cases")
    for name in names:
        print(f"- {name}: TTFT median {statistics.median(ttft[name]) * 1e3:.1f} ms, "
              f"{statistics.mean(share[name]):.1%} of the earlier prompt reused")


if __name__ == "__main__":
    main()
