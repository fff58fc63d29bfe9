"""The engine's host cost per generated token: a tiny model (small vocabulary, 2 layers) whose
forward costs little, many sequences decoding together through ``LLM.generate``, so that what a step
costs is mostly the engine's Python (scheduling, step inputs, sampling bookkeeping, detokenising).

    python benchmarks/engine/bench_host_overhead.py --seqs 256 --tokens 64 --repeats 3
    python benchmarks/engine/bench_host_overhead.py --profile          # cProfile of one run, by own time

Reports the median wall time per generated token (all sequences together) and per engine step; the
model's share (``model_us_per_token``: time inside the backend's forward and the lm_head, measured
the same way in any version of the engine) and the engine's (``engine_us_per_token``: the rest,
sampling included; ``engine_cpu_us_per_token``: the same in the calling thread's CPU time, which a
busy machine disturbs less, for serial steps where the engine runs on that thread); and, where the engine reports its step events, the device's share (forward
and sampling, from a step's start on the device to its end) and the host's (the rest: scheduling,
step inputs, appending, stops).

Interleaved A/B of engine versions (each a ``src`` directory; one process per run, alternating):

    python benchmarks/engine/bench_host_overhead.py --versions base=/tmp/base/src,new=src --rounds 3"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import statistics
import subprocess
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
    p.add_argument("--versions", help="name=src_dir,...: run each version in turn, --rounds times, and compare")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if args.versions:
        return compare(args)

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

    # seconds inside the backend's forward and the lm_head, in any version of the engine: wall time,
    # and this thread's CPU time (the engine's own share in CPU time is robust to a busy machine)
    model = [0.0, 0.0]

    def timed(obj: object, name: str) -> None:
        inner = getattr(obj, name)

        def call(*a: object, **k: object) -> object:
            t, c = time.perf_counter(), time.thread_time()
            try:
                return inner(*a, **k)
            finally:
                model[0] += time.perf_counter() - t
                model[1] += time.thread_time() - c

        setattr(obj, name, call)

    timed(llm.engine.backend, "forward")
    timed(llm.engine.model, "compute_logits")

    cpu = [0.0]  # the caller's thread's CPU seconds outside the model in the last run (serial steps: the engine's)

    def run() -> tuple[float, int]:
        prompts = [{"prompt_token_ids": [rng.randrange(300, 4000) for _ in range(args.prompt)]} for _ in range(args.seqs)]
        device[0] = model[0] = model[1] = 0.0
        t0, c0 = time.perf_counter(), time.thread_time()
        outs = llm.generate(prompts, params, use_tqdm=False)
        cpu[0] = time.thread_time() - c0 - model[1]
        return time.perf_counter() - t0, sum(len(o.outputs[0].token_ids) for o in outs)

    run()  # warm-up
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        run()
        prof.disable()
        pstats.Stats(prof).sort_stats(os.environ.get("PROFILE_SORT", "tottime")).print_stats(int(os.environ.get("PROFILE_N", "30")))
        return 0
    per_token, device_per_token, model_per_token, cpu_per_token = [], [], [], []
    for _ in range(args.repeats):
        seconds, tokens = run()
        per_token.append(seconds / tokens * 1e6)
        device_per_token.append(device[0] / tokens * 1e6)
        model_per_token.append(model[0] / tokens * 1e6)
        cpu_per_token.append(cpu[0] / tokens * 1e6)
    med = statistics.median(per_token)
    report = {"seqs": args.seqs, "tokens": args.tokens, "us_per_token": round(med, 2),
              "ms_per_step": round(med * args.seqs / 1e3, 3), "runs_us_per_token": [round(x, 2) for x in per_token],
              "model_us_per_token": round(statistics.median(model_per_token), 2),
              "engine_us_per_token": round(statistics.median(t - m for t, m in zip(per_token, model_per_token,
                                                                                       strict=True)), 2),
              "engine_cpu_us_per_token": round(statistics.median(cpu_per_token), 2)}
    if hasattr(llm.engine, "on_step_event"):
        report["device_us_per_token"] = round(statistics.median(device_per_token), 2)
        host = [p - d for p, d in zip(per_token, device_per_token, strict=True)]
        report["host_us_per_token"] = round(statistics.median(host), 2)
    print(json.dumps(report))
    return 0


def compare(args: argparse.Namespace) -> int:
    """Each version's runs in turn (one process each, ``PYTHONPATH`` its src), ``--rounds`` times;
    the medians of each figure and every version's ratio to the first."""
    versions = [v.split("=", 1) for v in args.versions.split(",")]
    passed = ["--seqs", str(args.seqs), "--tokens", str(args.tokens), "--prompt", str(args.prompt), "--repeats",
              str(args.repeats), "--temperature", str(args.temperature), "--async-scheduling", args.async_scheduling]
    runs: dict[str, list[dict]] = {name: [] for name, _ in versions}
    for _ in range(args.rounds):
        for name, src in versions:
            env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
            out = subprocess.run([sys.executable, __file__, *passed], env=env, capture_output=True, text=True, check=True)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(name, json.dumps(runs[name][-1]), flush=True)
    keys = ("us_per_token", "model_us_per_token", "engine_us_per_token", "engine_cpu_us_per_token", "host_us_per_token")
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in keys if all(k in r for r in rs)}
               for name, rs in runs.items()}
    first = versions[0][0]
    for name, figures in medians.items():
        ratios = {k: round(v / medians[first][k], 3) for k, v in figures.items() if k in medians[first]}
        print(json.dumps({"version": name, **{k: round(v, 2) for k, v in figures.items()}, f"ratio_to_{first}": ratios}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
