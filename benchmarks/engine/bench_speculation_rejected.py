"""The cost of speculation when every draft is wrong: the auto-off's worst case, interleaved.

Random weights do not give it: their greedy text loops, and drafts copied from a loop are all
accepted. So the proposer here is made to propose, at every step it would look up, K copies of a
token the model does not produce (a token id it never emits in the run): every draft is verified
and rejected, and what remains is the auto-off's work (the first window, the probes after each
back-off). One engine with ``--speculative-config`` and one without decode the same requests in
turns; the median decode tok/s of each and their ratio are printed.

    OMP_NUM_THREADS=2 python benchmarks/engine/bench_speculation_rejected.py models/qwen3-0.6b-random --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics

from swiftlm import LLM, SamplingParams
from swiftlm.engine.speculation import NgramIndex

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--speculative-config", default=json.dumps(SPEC))
    args = ap.parse_args()
    kw = {"dtype": "bfloat16", "enable_prefix_caching": False, "max_model_len": 4096}
    plain = LLM(args.model, **kw)
    spec = LLM(args.model, speculative_config=json.loads(args.speculative_config), **kw)
    prompt = list(range(1000, 1100))
    seen = set(plain.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0.0, max_tokens=args.tokens,
                                                                           ignore_eos=True))[0].outputs[0].token_ids)
    wrong = next(t for t in range(plain.engine.model.config.vocab_size - 1, 0, -1) if t not in seen)
    NgramIndex.propose = lambda self, tokens, k: [wrong] * k  # every lookup "matches", every draft is wrong
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    speeds: dict[str, list[float]] = {"plain": [], "spec": []}
    for rep in range(args.repeats + 1):  # the first round warms up
        for name in (("plain", "spec") if rep % 2 else ("spec", "plain")):
            llm = plain if name == "plain" else spec
            out = llm.generate([{"prompt_token_ids": prompt}], params)[0]
            m = out.metrics
            decode_s = m.finished_time - m.first_token_time  # after the first token (one clock)
            if rep:
                speeds[name].append((len(out.outputs[0].token_ids) - 1) / decode_s)
    s = spec.engine.speculator.stats
    p, q = statistics.median(speeds["plain"]), statistics.median(speeds["spec"])
    print(f"plain {p:.1f} tok/s, speculation {q:.1f} tok/s: {q / p:.3f}x; drafts {s.num_drafts} "
          f"({s.num_draft_tokens} tokens, {s.num_accepted_tokens} accepted) over {args.repeats + 1} requests "
          f"of {args.tokens} tokens")


if __name__ == "__main__":
    main()
