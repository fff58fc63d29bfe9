"""The backend's one-pass greedy pick against the sampler's argmax, alternating per request in one process.

    OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores THP_MEM_ALLOC_ENABLE=1 \\
        .venv/bin/python benchmarks/cpu/ab_greedy_pick.py models/qwen3-0.6b-random --rounds 24

Each round generates the same greedy request once with ``Backend.greedy_pick`` and once with it
turned off (the order alternating), and times the decode per token and the time the runner's
``_sample`` spends outside the lm_head. Prints medians and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

from swiftlm import LLM, SamplingParams
from swiftlm.runner.runner import ModelRunner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=33)
    ap.add_argument("--kv-cache-dtype", default="int8")
    args = ap.parse_args()
    llm = LLM(args.model, kv_cache_dtype=args.kv_cache_dtype)
    backend, model = llm.engine.backend, llm.engine.model
    pick = backend.greedy_pick
    spent = {"sample": 0.0, "logits": 0.0}
    sample, logits = ModelRunner._sample, type(model).compute_logits

    def timed_sample(self, *a):  # noqa: ANN001, ANN202
        t = time.perf_counter()
        sample(self, *a)
        spent["sample"] += time.perf_counter() - t

    def timed_logits(self, h):  # noqa: ANN001, ANN202
        t = time.perf_counter()
        out = logits(self, h)
        spent["logits"] += time.perf_counter() - t
        return out

    ModelRunner._sample = timed_sample
    type(model).compute_logits = timed_logits
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    prompt = [{"prompt_token_ids": list(range(100, 132))}]
    llm.generate(prompt, params)
    ms: dict[str, list[float]] = {"pick": [], "sampler": []}
    outside: dict[str, list[float]] = {"pick": [], "sampler": []}
    for r in range(args.rounds):
        for mode in ("pick", "sampler") if r % 2 == 0 else ("sampler", "pick"):
            backend.greedy_pick = pick if mode == "pick" else (lambda _logits: None)
            spent["sample"] = spent["logits"] = 0.0
            t = time.perf_counter()
            llm.generate(prompt, params)
            ms[mode].append((time.perf_counter() - t) / args.tokens * 1e3)
            outside[mode].append((spent["sample"] - spent["logits"]) / args.tokens * 1e3)
    for mode in ms:
        print(f"{mode:8s} decode {statistics.median(ms[mode]):.2f} ms a token, sampling outside the lm_head "
              f"{statistics.median(outside[mode]):.3f} ms a step")
    ratios = [b / a for a, b in zip(ms["pick"], ms["sampler"], strict=True)]
    print(f"pick speed-up, median of per-round ratios: {statistics.median(ratios):.4f}x")


if __name__ == "__main__":
    main()
