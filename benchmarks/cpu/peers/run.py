"""CPU peer benchmark: swiftlm (bf16, int8, int4), llama.cpp (BF16 with flash attention off and on,
Q8_0, Q4_0) and Hugging Face transformers (bf16) on the same random Qwen3-0.6B-shape checkpoint,
single request, in one run: every engine is loaded once in its own worker process (worker.py),
then the segments are interleaved (each repeat visits every engine for every prompt length, in
an order that rotates), with the memory bandwidth probed before and after each timed segment.

    .venv/bin/python benchmarks/cpu/peers/run.py --model models/qwen3-0.6b-random \\
        --gguf-dir models/qwen3-0.6b-random-gguf --llama-python /work/peers-venv/bin/python \\
        --repeats 5 --output bench-out/cpu-peers

Prints and writes (results.md, results.json) the table of medians with the ratios the CPU issue
asks for. The decode bound is bandwidth / bytes streamed per token (every linear weight once).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from swiftlm.bench.bandwidth import BandwidthProbe
from swiftlm.threads import all_cpus

WORKER = Path(__file__).with_name("worker.py")


@dataclass
class Worker:
    label: str
    command: list[str]
    bytes_per_weight: float
    proc: subprocess.Popen | None = None
    load_s: float = 0.0

    def start(self) -> None:
        with all_cpus():  # not the core OpenMP bound this process's main thread to (threads.all_cpus)
            self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self._read()
        self.load_s = ready["load_s"]

    def run(self, prompt: list[int], decode: int, batch: int = 0) -> dict:
        request = {"prompt": prompt, "decode": decode} | ({"batch": batch} if batch else {})
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def _read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker {self.label} exited with {self.proc.wait()}")
            if line.startswith("{"):
                return json.loads(line)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def linear_weights(model_dir: Path) -> int:
    c = json.loads((model_dir / "config.json").read_text())
    h, i, d = c["hidden_size"], c["intermediate_size"], c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    return c["num_hidden_layers"] * (h * (q + 2 * kv) + q * h + 3 * h * i) + c["vocab_size"] * h


def workers(args: argparse.Namespace) -> list[Worker]:
    py, model, gguf = sys.executable, args.model, Path(args.gguf_dir)
    name = Path(model).name
    swift = [py, str(WORKER), "swiftlm", model, "--threads", str(args.threads)]
    llama = [args.llama_python, str(WORKER), "llama"]
    found = [
        Worker("swiftlm bf16", swift, 2.0),
        Worker("swiftlm int8", [*swift, "--quantization", "int8"], 1.0 + 4 / 1024),
        Worker("swiftlm int4", [*swift, "--quantization", "int4"], 0.5 + 4 / 64),
        Worker("swiftlm bf16 kv int8", [*swift, "--kv-cache-dtype", "int8"], 2.0),
        Worker("swiftlm bf16 kv int8 blocks of 16", [*swift, "--kv-cache-dtype", "int8", "--block-size", "16"], 2.0),
        Worker("swiftlm bf16 kv fp8", [*swift, "--kv-cache-dtype", "fp8"], 2.0),
        Worker("transformers bf16", [py, str(WORKER), "hf", model, "--threads", str(args.threads)], 2.0),
    ]
    for label, file, extra, bpw in (
        ("llama.cpp BF16", f"{name}-bf16.gguf", [], 2.0),
        ("llama.cpp BF16 fa", f"{name}-bf16.gguf", ["--flash-attn"], 2.0),
        ("llama.cpp BF16 fa kv q8_0", f"{name}-bf16.gguf", ["--flash-attn", "--kv-cache-dtype", "q8_0"], 2.0),
        ("llama.cpp Q8_0", f"{name}-q8_0.gguf", ["--no-extra-bufts"], 34 / 32),
        ("llama.cpp Q4_0", f"{name}-q4_0.gguf", ["--no-extra-bufts"], 18 / 32),
    ):
        if (gguf / file).exists() and args.llama_python:
            found.append(Worker(label, [*llama, str(gguf / file), "--threads", str(args.threads), *extra], bpw))
    return [w for w in found if not args.only or any(o in w.label for o in args.only)]


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def render(records: list[dict], ws: list[Worker], prompts: list[int], n_weights: int) -> str:
    def cell(label: str, p: int, key: str) -> float:
        return med([r[key] for r in records if r["engine"] == label and r["prompt_len"] == p])

    head = "| engine | load s | " + " | ".join(
        f"prompt {p}: decode tok/s" if p == prompts[0] else f"prompt {p}: TTFT s / decode" for p in prompts
    ) + f" | bandwidth GB/s | decode bound tok/s (prompt {prompts[0]}) | of bound |"
    lines = [head, "|---" * (len(prompts) + 5) + "|"]
    for w in ws:
        cols = []
        for p in prompts:
            d = cell(w.label, p, "decode_tok_s")
            cols.append(f"{d:.1f}" if p == prompts[0] else f"{cell(w.label, p, 'ttft_s'):.2f} / {d:.1f}")
        bw = cell(w.label, prompts[0], "bandwidth_gb_s")
        bound = bw * 1e9 / (n_weights * w.bytes_per_weight)
        frac = cell(w.label, prompts[0], "decode_tok_s") / bound
        lines.append(f"| {w.label} | {w.load_s:.1f} | " + " | ".join(cols) + f" | {bw:.0f} | {bound:.1f} | {frac:.0%} |")
    return "\n".join(lines)


def ratios(records: list[dict], prompts: list[int]) -> list[str]:
    """The issue's ratios per prompt length; a ratio whose engines did not run (--only) is left out."""
    def m(label: str, p: int, key: str) -> float:
        return med([r[key] for r in records if r["engine"] == label and r["prompt_len"] == p])

    def best(values: list[float], pick) -> float:
        present = [v for v in values if not math.isnan(v)]
        return pick(present) if present else float("nan")

    out = []
    for p in prompts:
        best_bf16 = best([m("llama.cpp BF16", p, "decode_tok_s"), m("llama.cpp BF16 fa", p, "decode_tok_s")], max)
        # llama.cpp's best bf16-weight decode, its 8-bit KV cache included
        best_any = best([best_bf16, m("llama.cpp BF16 fa kv q8_0", p, "decode_tok_s")], max)
        best_ttft = best([m("llama.cpp BF16", p, "ttft_s"), m("llama.cpp BF16 fa", p, "ttft_s")], min)
        parts = [
            ("bf16 decode swiftlm / llama.cpp BF16 (best of fa off/on)", m("swiftlm bf16", p, "decode_tok_s") / best_bf16),
            ("TTFT swiftlm / llama.cpp BF16", m("swiftlm bf16", p, "ttft_s") / best_ttft),
            ("bf16 kv int8 decode / llama.cpp best bf16 (kv q8_0 included)",
             m("swiftlm bf16 kv int8", p, "decode_tok_s") / best_any),
            ("bf16 kv fp8 decode / llama.cpp best bf16 (kv q8_0 included)",
             m("swiftlm bf16 kv fp8", p, "decode_tok_s") / best_any),
            ("int8 / Q8_0 decode", m("swiftlm int8", p, "decode_tok_s") / m("llama.cpp Q8_0", p, "decode_tok_s")),
            ("int4 / Q4_0 decode", m("swiftlm int4", p, "decode_tok_s") / m("llama.cpp Q4_0", p, "decode_tok_s")),
            ("int8 TTFT / llama.cpp BF16 TTFT", m("swiftlm int8", p, "ttft_s") / best_ttft),
            ("int4 TTFT / llama.cpp BF16 TTFT", m("swiftlm int4", p, "ttft_s") / best_ttft),
        ]
        shown = [f"{name} = {value:.2f}" for name, value in parts if not math.isnan(value)]
        out.append(f"- prompt {p}: " + "; ".join(shown))
    return out


def peer_arguments(description: str) -> argparse.ArgumentParser:
    """The arguments every peer script takes: the checkpoint, its GGUFs, llama.cpp's Python, threads."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--gguf-dir", required=True)
    ap.add_argument("--llama-python", default="/work/peers-venv/bin/python")
    ap.add_argument("--threads", type=int, default=2)
    return ap


def main() -> None:
    ap = peer_arguments(__doc__)
    ap.add_argument("--prompts", default="32,512,2048")
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", nargs="*", help="run only engines whose label contains one of these")
    ap.add_argument("--output", default="bench-out/cpu-peers")
    args = ap.parse_args()
    prompts = [int(p) for p in args.prompts.split(",")]
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    probe = BandwidthProbe()
    ws = workers(args)
    records: list[dict] = []
    try:
        for w in ws:
            w.start()
            print(f"loaded {w.label} in {w.load_s:.1f} s", flush=True)
        for rep in range(args.repeats):
            for p in prompts:
                g = torch.Generator().manual_seed(1000 * rep + p)
                prompt = torch.randint(0, 151000, (p,), generator=g).tolist()
                shift = rep % len(ws)
                order = ws[shift:] + ws[:shift]
                if rep % 2:
                    order.reverse()
                for w in order:
                    before = probe.measure(3)
                    result = w.run(prompt, args.decode)
                    after = probe.measure(3)
                    rec = {"engine": w.label, "repeat": rep, "prompt_len": p, "decode_tokens": args.decode,
                           "bw_before_gb_s": before, "bw_after_gb_s": after, "bandwidth_gb_s": (before + after) / 2,
                           "time": time.time(), **result}
                    records.append(rec)
                    print(json.dumps(rec), flush=True)
    finally:
        for w in ws:
            w.stop()
    table = render(records, ws, prompts, linear_weights(Path(args.model)))
    text = "\n".join([f"# CPU peers, {args.repeats} repeats, medians", "", table, "", *ratios(records, prompts), ""])
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "records": records,
                                                  "load_s": {w.label: w.load_s for w in ws}}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
