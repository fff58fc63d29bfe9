"""Decode at one long context, swiftlm against llama.cpp, in short interleaved bursts.

    OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores .venv/bin/python benchmarks/cpu/peers/long_context_ab.py \\
        --model models/qwen3-0.6b-random --gguf-dir models/qwen3-0.6b-random-gguf \\
        --llama-python /work/peers-venv/bin/python --context 2048 --rounds 20

run.py times each engine's decode right after its own prefill of the prompt (11-20 s at 2048 tokens
on 2 cores), so two engines' decodes are minutes apart, and on a machine whose memory bandwidth swings
by 1.6x from minute to minute that alone can move their ratio by as much. Here every engine (its own
worker process, ``worker.py --reuse-prompt``) computes the same random prompt once; then each round
decodes ``--decode`` tokens from the prompt's end in every engine, one after the other (the order
rotating, and reversing every other round): swiftlm serves the repeated prompt from its prefix cache
and llama.cpp rewinds its context to the prompt's end, so a burst costs about one prompt token plus
its decode, and a round takes seconds. The bandwidth is probed at the start of each round.

Prints each engine's median decode tok/s and, per round, its ratio to the best llama.cpp
configuration of that round (medians over the rounds, and over the faster and slower halves of the
rounds by probed bandwidth).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import peer_arguments, workers  # noqa: E402

from swiftlm.bench.bandwidth import BandwidthProbe  # noqa: E402

DEFAULT_ENGINES = ("swiftlm bf16", "swiftlm bf16 kv int8", "swiftlm bf16 kv fp8", "llama.cpp BF16", "llama.cpp BF16 fa")


def per_round_ratios(records: list[dict], label: str, rounds: list[int]) -> list[float]:
    """label's decode tok/s over the best llama.cpp configuration's, in each of these rounds."""
    out = []
    for r in rounds:
        mine = [x["decode_tok_s"] for x in records if x["round"] == r and x["engine"] == label]
        peers = [x["decode_tok_s"] for x in records if x["round"] == r and x["engine"].startswith("llama.cpp")]
        if mine and peers:
            out.append(mine[0] / max(peers))
    return out


def main() -> None:
    ap = peer_arguments(__doc__)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--decode", type=int, default=16, help="tokens decoded per burst")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--only", nargs="*", default=list(DEFAULT_ENGINES),
                    help="engines (run.py's labels) whose label is one of these")
    ap.add_argument("--json", help="write every burst's record here")
    args = ap.parse_args()
    only = set(args.only)
    args.only = None  # run.workers matches substrings; the labels here are matched exactly
    ws = [w for w in workers(args) if w.label in only]
    if not any(w.label.startswith("llama.cpp") for w in ws) or not any(w.label.startswith("swiftlm") for w in ws):
        raise SystemExit("needs a swiftlm engine and a llama.cpp engine (is --gguf-dir right?)")
    for w in ws:
        w.command = [*w.command, "--reuse-prompt"]
    torch.set_num_threads(args.threads)
    probe = BandwidthProbe()
    prompt = torch.randint(0, 151000, (args.context,), generator=torch.Generator().manual_seed(args.context)).tolist()
    records: list[dict] = []
    try:
        for w in ws:
            w.start()
            first = w.run(prompt, 1)  # the prompt's one full computation
            print(f"{w.label}: loaded in {w.load_s:.1f} s, {args.context}-token prompt in {first['ttft_s']:.1f} s",
                  flush=True)
        for r in range(args.rounds):
            bandwidth = probe.measure(3)
            order = ws[r % len(ws):] + ws[:r % len(ws)]
            for w in order if r % 2 == 0 else order[::-1]:
                result = w.run(prompt, args.decode)
                records.append({"round": r, "engine": w.label, "bandwidth_gb_s": bandwidth, "time": time.time(),
                                **result})
            print(f"round {r}: {bandwidth:.1f} GB/s: " + ", ".join(
                f"{x['engine']} {x['decode_tok_s']:.1f}" for x in records if x["round"] == r), flush=True)
    finally:
        for w in ws:
            w.stop()
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "records": records}, indent=1))
    bws = {r: next(x["bandwidth_gb_s"] for x in records if x["round"] == r) for r in range(args.rounds)}
    by_bw = sorted(bws, key=bws.get)
    slow, fast = by_bw[: args.rounds // 2], by_bw[args.rounds // 2:]
    print(f"\ncontext {args.context}, {args.decode} tokens a burst, {args.rounds} rounds; bandwidth median "
          f"{statistics.median(bws.values()):.1f} GB/s (range {min(bws.values()):.1f}-{max(bws.values()):.1f}; "
          f"slower half {statistics.median(bws[r] for r in slow):.1f}, faster half "
          f"{statistics.median(bws[r] for r in fast):.1f})\n")
    print("| engine | decode tok/s (median) | vs llama.cpp's best, per round | slower half | faster half |")
    print("|---|---:|---:|---:|---:|")
    for w in ws:
        tps = statistics.median(x["decode_tok_s"] for x in records if x["engine"] == w.label)
        cells = []
        for rounds in (range(args.rounds), slow, fast):
            q = per_round_ratios(records, w.label, list(rounds))
            cells.append(f"{statistics.median(q):.2f}x" if q else "-")
        print(f"| {w.label} | {tps:.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
