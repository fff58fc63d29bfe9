"""Batched decode steps alone: B prompts prefilled first, then the time of each decode step of all B.

    PYTHONPATH=<tree>/src python benchmarks/engine/batch_decode_steps.py models/qwen3-0.6b-random \\
        --prompt 512 --batch 16 --label new

``ab_versions.py --batch`` reads batched decode as the difference of two whole ``generate`` runs, each
with the prefill of every prompt: at long prompts the prefill's run-to-run noise swamps the decode in
it. This drives the engine directly: it steps until every prompt is prefilled, then times ``--steps``
decode steps and prints their median (run it for each tree in turn, alternating).
"""

from __future__ import annotations

import argparse
import statistics
import time

from swiftlm import LLM, SamplingParams
from swiftlm.core.generation import GenerationRequest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens of each request")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=32, help="decode steps timed")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    llm = LLM(args.model, max_model_len=args.prompt + args.steps + 16)
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=args.steps + 8, ignore_eos=True)
    for i in range(args.batch):  # distinct prompts: no prefix sharing
        ids = [(t * 31 + 7919 * i) % 150000 + 10 for t in range(args.prompt)]
        engine.add_request(GenerationRequest(request_id=f"r{i}", prompt_token_ids=ids, sampling_params=params))
    while engine.scheduler.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running):
        engine.step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    while engine.has_unfinished():
        engine.step()
    step = statistics.median(times)
    print(f"{args.label}: {args.batch}-way decode at {args.prompt} tokens: {step * 1e3:.1f} ms a step, "
          f"{args.batch / step:.1f} tok/s", flush=True)


if __name__ == "__main__":
    main()
