"""The CPU prefill attention kernel's numerical cost on the real model: SmolLM2-135M-Instruct (the
installed GGUF) scores a fixed English text (``tests/data/public_domain_english.txt``, two windows of
1,024 tokens, prompt logprobs) in bfloat16 with the kernel and with gather + SDPA, and in float32;
prints each one's perplexity and the bf16 runs' top-1 agreement and largest |delta logprob| against
float32.

    python benchmarks/quality/prefill_quality.py [--kv-cache-dtype int8]
"""

from __future__ import annotations

import argparse
import math

from real_model_quality import text_tokens

from swiftlm import LLM, SamplingParams
from swiftlm.model.default_model import default_model_path


def scored(llm: LLM, windows: list[list[int]]) -> tuple[list[float], list[int]]:
    """Each scored position's logprob of the text's token, and the model's most likely token there."""
    params = SamplingParams(prompt_logprobs=1, max_tokens=1, temperature=0.0)
    logprobs, top = [], []
    for w, out in zip(windows, llm.generate([{"prompt_token_ids": w} for w in windows], params, use_tqdm=False),
                      strict=True):
        for token, ranked in zip(w[1:], out.prompt_logprobs[1:], strict=True):
            logprobs.append(ranked[token])
            top.append(max(ranked, key=ranked.__getitem__))
    return logprobs, top


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--window", type=int, default=1024)
    args = ap.parse_args()
    path = str(default_model_path())
    engines = {
        "bf16, prefill kernel": LLM(path, dtype="bfloat16", kv_cache_dtype=args.kv_cache_dtype),
        "bf16, gather + SDPA": LLM(path, dtype="bfloat16", kv_cache_dtype=args.kv_cache_dtype,
                                   cpu_disable_kernels=["prefill_attention"]),
        "float32": LLM(path, dtype="float32"),
    }
    ids = text_tokens(engines["float32"].engine.tokenizer)
    windows = [ids[i:i + args.window] for i in range(0, 2 * args.window, args.window)]
    results = {name: scored(llm, windows) for name, llm in engines.items()}
    ref_lp, ref_top = results["float32"]
    for name, (lp, top) in results.items():
        line = f"{name} (kv {args.kv_cache_dtype}): perplexity {math.exp(-sum(lp) / len(lp)):.3f} over {len(lp)} positions"
        if name != "float32":
            agree = sum(a == b for a, b in zip(top, ref_top, strict=True)) / len(top)
            worst = max(abs(a - b) for a, b in zip(lp, ref_lp, strict=True))
            line += f"; against float32: top-1 agreement {agree:.2%}, max |delta logprob| {worst:.3f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
