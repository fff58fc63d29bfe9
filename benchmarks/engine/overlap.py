"""Overlapped steps against serial ones, on a backend whose device time is fixed (no GPU needed).

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/engine/overlap.py --device-ms 2 10 --seqs 64 256

A tiny model (a 1,024-token vocabulary) decodes ``--seqs`` sequences together on ``FixedTimeBackend``
without its layers (``run_model=False``): every forward takes D ms, sleeping off the GIL as a GPU's
step leaves the host free, and the lm_head's few rows are all the CPU work the device thread adds. Per (D, seqs), serial and overlapped runs alternate (``--rounds``); from the engine's
step events, for the decode steps:

- device: median time from a step's start on the device to its end (D and the tiny model's sampling);
- host: in serial runs, a step's wall time less its device time (schedule, build, land, emit);
- wall: median wall time per decode step, serial and overlapped;
- ratio: overlapped wall / max(host, device): 1.0 is perfect overlap (the acceptance: within 15 %).

``--asynchronous``: the backend models a GPU's launches as well (``FixedTimeBackend(asynchronous=True)``):
a step's D runs on the device's own clock after the step before it, and the host waits for it only
when the step lands; device is D, host a serial step's wall time less D.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 4096, "vocab_size": 1024,
         "tie_word_embeddings": True}


def run_once(llm, seqs: int, tokens: int, rng: random.Random) -> tuple[list[float], list[float]]:
    """(wall per decode step, device time per decode step) of one generate call."""
    from swiftlm import SamplingParams

    events: list[tuple[str, int, float]] = []
    llm.engine.on_step_event = lambda kind, index, t: events.append((kind, index, t))
    prompts = [{"prompt_token_ids": [rng.randrange(300, 1000) for _ in range(16)]} for _ in range(seqs)]
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True), use_tqdm=False)
    llm.engine.on_step_event = None
    start = {i: t for kind, i, t in events if kind == "device_start"}
    end = {i: t for kind, i, t in events if kind == "device_end"}
    steps = sorted(end)[2:-1]  # decode steps: past the prefill, before the last
    device = [end[i] - start[i] for i in steps]
    wall = [(end[b] - end[a]) / (b - a) for a, b in zip(steps, steps[1:], strict=False)]
    return wall, device


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device-ms", type=float, nargs="+", default=[2.0, 10.0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--asynchronous", action="store_true", help="model a GPU's asynchronous launches too")
    args = ap.parse_args()

    from make_random_model import write_tokenizer_files

    from swiftlm import LLM
    from swiftlm.backends.cpu.backend import CpuBackend
    from swiftlm.backends.fixed_time import FixedTimeBackend
    from swiftlm.model.random_checkpoint import write_random_checkpoint

    path = Path(tempfile.mkdtemp(prefix="swiftlm_overlap_")) / "tiny"
    write_random_checkpoint(path, SHAPE, seed=0, dtype=torch.float32, std=0.05)
    write_tokenizer_files(path)
    rng = random.Random(0)
    rows = []
    for device_ms in args.device_ms:
        for seqs in args.seqs:
            engines = {}
            for overlap in (False, True):
                backend = FixedTimeBackend(CpuBackend(), device_ms / 1e3, run_model=False,
                                           asynchronous=args.asynchronous)
                engines[overlap] = LLM(str(path), dtype="float32", backend=backend, async_scheduling=overlap,
                                       max_num_seqs=seqs, max_model_len=16 + args.tokens + 16,
                                       max_num_batched_tokens=max(2048, seqs * 16), num_blocks=seqs * 6 + 64)
                run_once(engines[overlap], seqs, 4, rng)  # warm-up
            walls: dict[bool, list[float]] = {False: [], True: []}
            devices: list[float] = []
            hosts: list[float] = []
            for _ in range(args.rounds):
                for overlap in (False, True):
                    wall, device = run_once(engines[overlap], seqs, args.tokens, rng)
                    walls[overlap] += wall
                    if not overlap:
                        if args.asynchronous:  # the job only launches: the device's time is D
                            device = [device_ms / 1e3] * len(wall)
                        devices += device
                        hosts += [w - d for w, d in zip(wall, device, strict=False)]
            device, host = statistics.median(devices), statistics.median(hosts)
            serial, overlapped = statistics.median(walls[False]), statistics.median(walls[True])
            row = {"device_ms": device_ms, "seqs": seqs, "device": round(device * 1e3, 3), "host": round(host * 1e3, 3),
                   "serial": round(serial * 1e3, 3), "overlapped": round(overlapped * 1e3, 3),
                   "ratio": round(overlapped / max(host, device), 3)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            time.sleep(0.5)
    print("| D ms | seqs | device ms | host ms | serial ms/step | overlapped ms/step | overlapped / max(host, device) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['device_ms']:g} | {r['seqs']} | {r['device']} | {r['host']} | {r['serial']} | {r['overlapped']} | "
              f"{r['ratio']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
