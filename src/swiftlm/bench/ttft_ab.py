"""Time to first token of two or more engines on the same fresh prompts, interleaved: the A/B that the
kernel benchmarks share (``benchmarks/cpu/gemm_ab.py``, ``benchmarks/cpu/bench_prefill.py``).

Each round sends every engine the same fresh random prompt (no prefix hit), in an order that reverses
every round, and times ``generate(max_tokens=1)``; the medians per prompt length come back. Engines go
in with their KV pools written once (``prefaulted``): a fresh pool hands out blocks never used before,
and on a VM a page's first touch can cost milliseconds a MB, which would land in whichever TTFT first
stores into it.
"""

from __future__ import annotations

import statistics
import time

import torch

from swiftlm.llm import LLM
from swiftlm.sampling import SamplingParams


def prefaulted(llm: LLM) -> LLM:
    """``llm`` with every page of its KV pools (and their scale pools) written once."""
    k_pools, v_pools = llm.engine.kv_cache.pools()
    k_scales, v_scales = llm.engine.kv_cache.scale_pools()
    for pool in (*k_pools, *v_pools, *k_scales, *v_scales):
        pool.zero_()
    return llm


def ttft_ab(engines: dict[str, LLM], lengths: list[int], rounds: int, seed: int = 1) -> dict[int, dict[str, float]]:
    """{prompt length: {engine: median TTFT s}}; every engine prefills one prompt of the longest length
    first (every matmul's row count once)."""
    params = SamplingParams(max_tokens=1, temperature=0.0)
    g = torch.Generator().manual_seed(seed)

    def prompt(n: int) -> dict:
        return {"prompt_token_ids": torch.randint(100, 100_000, (n,), generator=g).tolist()}

    for llm in engines.values():
        llm.generate([prompt(max(lengths))], params, use_tqdm=False)
    medians: dict[int, dict[str, float]] = {}
    for n in lengths:
        times: dict[str, list[float]] = {name: [] for name in engines}
        for r in range(rounds):
            p = prompt(n)
            for name in list(engines) if r % 2 == 0 else list(engines)[::-1]:
                t0 = time.perf_counter()
                engines[name].generate([p], params, use_tqdm=False)
                times[name].append(time.perf_counter() - t0)
        medians[n] = {name: statistics.median(t) for name, t in times.items()}
    return medians
