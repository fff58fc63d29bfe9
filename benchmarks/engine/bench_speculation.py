"""Decode speed with and without prompt-lookup speculation (``--speculative-config``), interleaved.

Workloads, each a chat turn with thinking off, greedy unless ``--temperature``:

- summary: a long public-domain text (tests/data/public_domain_english.txt), then "Summarise it";
- edit:    a paragraph of it, then "Repeat the following paragraph with small edits";
- chat:    short free questions (little to copy: speculation should cost next to nothing).

One engine with speculation and one without, on the same model; each repeat runs the request on
both, alternating which goes first. Per workload: median decode tok/s (output tokens after the
first, over the time after the first token), the speed-up, the acceptance rate (accepted / draft
tokens), accepted tokens per verification step (1 + accepted / drafts), and whether greedy output
was identical. ``--random-model DIR`` runs the same on random weights, whose drafts are nearly
all rejected: the row there is the slowdown that the auto-off has to keep small.

    OMP_NUM_THREADS=2 python benchmarks/engine/bench_speculation.py                 # the default SmolLM2 GGUF
    OMP_NUM_THREADS=2 python benchmarks/engine/bench_speculation.py MODEL --random-model models/qwen3-0.6b-random
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from swiftlm import LLM, SamplingParams
from swiftlm.model.default_model import require_default_model

TEXT = Path(__file__).resolve().parents[2] / "tests" / "data" / "public_domain_english.txt"
DEFAULT_SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
QUESTIONS = ["What is a good name for a pet turtle? Give three ideas.",
             "Explain in a few sentences why the sky is blue.",
             "Write a short poem about autumn rain."]


def workloads(max_chars: int) -> dict[str, list[list[dict[str, str]]]]:
    body = TEXT.read_text(encoding="utf-8").split("\n", 1)[1].strip()
    paragraphs = [p for p in body.split("\n\n") if len(p) > 300]
    long_text = body[:max_chars]
    return {
        "summary": [[{"role": "user", "content": f"{long_text}\n\nSummarise it."}]],
        "edit": [[{"role": "user", "content": f"Repeat the following paragraph with small edits:\n\n{p[:1200]}"}]
                 for p in paragraphs[:3]],
        "chat": [[{"role": "user", "content": q}] for q in QUESTIONS],
    }


def run_one(llm: LLM, messages: list[dict[str, str]], params: SamplingParams) -> tuple[float, list[int]]:
    """Decode tok/s of one request (after its first token) and its output token ids."""
    out = llm.chat(messages, params, {"enable_thinking": False})
    m, ids = out.metrics, out.outputs[0].token_ids
    if m is None or m.first_token_time is None or m.finished_time is None or len(ids) < 2:
        return float("nan"), ids
    return (len(ids) - 1) / max(m.finished_time - m.first_token_time, 1e-9), ids


def spec_counters(llm: LLM) -> tuple[int, int, int]:
    s = llm.engine.stats()
    return s.spec_num_drafts, s.spec_num_draft_tokens, s.spec_num_accepted_tokens


def bench_model(model: str, spec: dict, args: argparse.Namespace) -> list[dict]:
    kwargs = {"dtype": args.dtype, "max_model_len": args.max_model_len}
    plain = LLM(model, **kwargs)
    fast = LLM(model, speculative_config=spec, **kwargs)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, ignore_eos=args.ignore_eos,
                            seed=0 if args.temperature > 0 else None)
    warm = [{"role": "user", "content": "Hello"}]
    for llm in (plain, fast):
        llm.chat(warm, SamplingParams(max_tokens=8), {"enable_thinking": False})
    rows = []
    for name, prompts in workloads(args.max_chars).items():
        speeds: dict[str, list[float]] = {"plain": [], "spec": []}
        identical = True
        before = spec_counters(fast)
        for r in range(args.repeats):
            for messages in prompts:
                order = [("plain", plain), ("spec", fast)] if r % 2 == 0 else [("spec", fast), ("plain", plain)]
                outs = {}
                for label, llm in order:
                    tok_s, outs[label] = run_one(llm, messages, params)
                    speeds[label].append(tok_s)
                identical &= outs["plain"] == outs["spec"]
        drafts, drafted, accepted = (a - b for a, b in zip(spec_counters(fast), before, strict=True))
        p, s = statistics.median(speeds["plain"]), statistics.median(speeds["spec"])
        rows.append({
            "model": Path(model).name, "workload": name, "plain_tok_s": p, "spec_tok_s": s, "speedup": s / p,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "accepted_per_step": 1 + accepted / drafts if drafts else 1.0, "drafts": drafts,
            "identical": identical if args.temperature == 0 else None,
        })
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("model", nargs="?", help="model directory / .gguf / hub id (default: the SmolLM2 GGUF)")
    ap.add_argument("--random-model", metavar="DIR", help="also run on this random-weight checkpoint (the slowdown)")
    ap.add_argument("--speculative-config", default=json.dumps(DEFAULT_SPEC), metavar="JSON")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--max-chars", type=int, default=6000, help="characters of the text for the summary")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    args = ap.parse_args()
    spec = json.loads(args.speculative_config)
    t0 = time.perf_counter()
    rows = bench_model(args.model or require_default_model(), spec, args)
    if args.random_model:
        args.ignore_eos = True  # random weights would stop at random
        rows += bench_model(args.random_model, spec, args)
    print(f"\nspeculative config: {json.dumps(spec)}; {args.repeats} repeats, max_tokens {args.max_tokens}, "
          f"{time.perf_counter() - t0:.0f}s\n")
    print("| model | workload | plain tok/s | spec tok/s | speed-up | acceptance | tokens/step | drafts | identical |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['model']} | {r['workload']} | {r['plain_tok_s']:.1f} | {r['spec_tok_s']:.1f} | "
              f"{r['speedup']:.2f}x | {r['acceptance_rate']:.0%} | {r['accepted_per_step']:.2f} | {r['drafts']} | "
              f"{'-' if r['identical'] is None else ('yes' if r['identical'] else 'NO')} |")


if __name__ == "__main__":
    main()
