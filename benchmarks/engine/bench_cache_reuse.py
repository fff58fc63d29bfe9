"""Time to first token with and without KV reuse, on a random Qwen3-0.6B-shape checkpoint.

1. Prefix cache: a request sharing a 1,000-token prefix with an earlier one, against the same
   request cold (cache reset), interleaved cold/warm over several repeats.
2. Session: turn 2 of a ~1,500-token conversation sent in its session, against the same turn
   sent fresh (no session, prefix cache off), with the prompt tokens each computed.

Usage: python benchmarks/engine/bench_cache_reuse.py models/qwen3-0.6b-random [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from swiftlm import LLM, SamplingParams
from swiftlm.bench.bandwidth import BandwidthProbe

ONE_TOKEN = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def ttft(llm: LLM, prompt_ids: list[int], session_id: str | None = None) -> tuple[float, int, int]:
    """Seconds to the first token, cached tokens, prompt tokens actually computed."""
    t0 = time.perf_counter()
    out = llm.generate({"prompt_token_ids": prompt_ids}, ONE_TOKEN, session_ids=[session_id])[0]
    return time.perf_counter() - t0, out.num_cached_tokens, out.metrics.num_computed_prompt_tokens


def prefix_case(llm: LLM, repeats: int) -> dict:
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(0, 150000, (1000,), generator=g).tolist()
    cold, warm, cached = [], [], []
    for _ in range(repeats):
        first = shared + torch.randint(0, 150000, (20,), generator=g).tolist()
        second = shared + torch.randint(0, 150000, (20,), generator=g).tolist()
        llm.engine.kv.pool.reset_cache()
        cold.append(ttft(llm, second)[0])  # nothing cached
        llm.engine.kv.pool.reset_cache()
        ttft(llm, first)  # the earlier request that leaves the prefix behind
        t, c, _ = ttft(llm, second)
        warm.append(t)
        cached.append(c)
    return {
        "cold_ttft_s": statistics.median(cold), "warm_ttft_s": statistics.median(warm),
        "ratio": statistics.median(warm) / statistics.median(cold), "num_cached_tokens": min(cached),
    }


def session_case(llm: LLM, repeats: int) -> dict:
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    fresh_t, session_t, fresh_computed, session_computed = [], [], [], []
    for r in range(repeats):
        sid = f"bench-session-{r}"
        g = torch.Generator().manual_seed(100 + r)
        words = " ".join(f"w{int(x)}" for x in torch.randint(0, 10_000, (300,), generator=g))
        messages = [{"role": "system", "content": "You are a helpful assistant. " + words},
                    {"role": "user", "content": "Summarise the notes above in one line."}]
        kwargs = {"enable_thinking": False}
        turn1 = llm.chat(messages, params, kwargs, session_id=sid)
        messages += [{"role": "assistant", "content": turn1.outputs[0].text}, {"role": "user", "content": "Shorter."}]
        prompt = llm.chat_prompt(messages, kwargs, session_id=sid)["prompt_token_ids"]
        llm.engine.kv.prefix_cache.enabled = False
        t, _, computed = ttft(llm, prompt)  # the same turn, sent fresh
        llm.engine.kv.prefix_cache.enabled = True
        fresh_t.append(t)
        fresh_computed.append(computed)
        t, _, computed = ttft(llm, prompt, session_id=sid)
        session_t.append(t)
        session_computed.append(computed)
        llm.close_session(sid)
    return {
        "conversation_tokens": len(prompt), "fresh_ttft_s": statistics.median(fresh_t),
        "session_ttft_s": statistics.median(session_t),
        "ratio": statistics.median(session_t) / statistics.median(fresh_t),
        "fresh_computed_prompt_tokens": fresh_computed[0], "session_computed_prompt_tokens": session_computed[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    llm = LLM(args.model, dtype=args.dtype, max_model_len=4096)
    probe = BandwidthProbe()
    ttft(llm, list(range(100, 164)))  # warm-up
    bw = probe.measure()
    result = {"dtype": llm.engine.dtype, "prefix": prefix_case(llm, args.repeats),
              "session": session_case(llm, args.repeats)}
    result["bandwidth_gb_s"] = (bw + probe.measure()) / 2
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
