"""The engine's host cost per generated token: a tiny model (small vocabulary, 2 layers) whose
forward costs little, many sequences decoding together through ``LLM.generate``, so that what a step
costs is mostly the engine's Python (scheduling, step inputs, sampling bookkeeping, detokenising).

    python benchmarks/engine/bench_host_overhead.py --seqs 256 --tokens 64 --repeats 3
    python benchmarks/engine/bench_host_overhead.py --profile          # cProfile of one run, by own time

Reports the median wall time per generated token (all sequences together) and per engine step, and,
where the engine reports its step events, the device's share (forward and sampling, from a step's
start on the device to its end) and the host's (the rest: scheduling, step inputs, appending, stops)."""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # make_random_model

SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 4096, "vocab_size": 4096,
         "tie_word_embeddings": True}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seqs", type=int, default=256)
    p.add_argument("--tokens", type=int, default=64, help="output tokens per sequence")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens per sequence")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--temperature", type=float, default=0.7, help="0: greedy (no sampling ops)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--async-scheduling", choices=("auto", "on", "off"), default="auto",
                   help="overlapped steps (auto: the engine's default for the device)")
    args = p.parse_args()

    import torch
    from make_random_model import write_tokenizer_files

    from swiftlm import LLM, SamplingParams
    from swiftlm.model.random_checkpoint import write_random_checkpoint

    path = Path(tempfile.mkdtemp(prefix="swiftlm_host_")) / "tiny"
    write_random_checkpoint(path, SHAPE, seed=0, dtype=torch.float32, std=0.05)
    write_tokenizer_files(path)
    overlap = {"auto": {}, "on": {"async_scheduling": True}, "off": {"async_scheduling": False}}[args.async_scheduling]
    llm = LLM(str(path), dtype="float32", max_num_seqs=args.seqs, **overlap, max_model_len=args.prompt + args.tokens + 16,
              max_num_batched_tokens=max(2048, args.seqs * args.prompt // 4), num_blocks=args.seqs * 8 + 64)
    rng = random.Random(0)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.tokens, ignore_eos=True)

    device = [0.0]  # seconds the device spent on steps (engines that report step events)
    started: dict[int, float] = {}

    def on_event(kind: str, index: int, t: float) -> None:
        if kind == "device_start":
            started[index] = t
        elif kind == "device_end":
            device[0] += t - started.pop(index)

    if hasattr(llm.engine, "on_step_event"):
        llm.engine.on_step_event = on_event

    def run() -> tuple[float, int]:
        prompts = [{"prompt_token_ids": [rng.randrange(300, 4000) for _ in range(args.prompt)]} for _ in range(args.seqs)]
        device[0] = 0.0
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t0, sum(len(o.outputs[0].token_ids) for o in outs)

    run()  # warm-up
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        run()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        return 0
    per_token, device_per_token = [], []
    for _ in range(args.repeats):
        seconds, tokens = run()
        per_token.append(seconds / tokens * 1e6)
        device_per_token.append(device[0] / tokens * 1e6)
    med = statistics.median(per_token)
    report = {"seqs": args.seqs, "tokens": args.tokens, "us_per_token": round(med, 2),
              "ms_per_step": round(med * args.seqs / 1e3, 3), "runs_us_per_token": [round(x, 2) for x in per_token]}
    if hasattr(llm.engine, "on_step_event"):
        report["device_us_per_token"] = round(statistics.median(device_per_token), 2)
        host = [p - d for p, d in zip(per_token, device_per_token, strict=True)]
        report["host_us_per_token"] = round(statistics.median(host), 2)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
