"""Decode speed with a json_schema grammar against unconstrained decode, interleaved, in one process.

    OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores \
        python benchmarks/engine/bench_structured.py models/qwen3-0.6b-random [--batch 1 16] [--repeats 5]

For each batch size: B prompts decoded together, once with a JSON schema constraint (a long array
of bounded strings, so random weights keep generating until max_tokens) and once without; decode
tok/s = generated tokens after the first of each / (time of the whole batch - time of B first
tokens). Also the grammar compile time of the schemas the tests use. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from swiftlm import LLM, SamplingParams
from swiftlm.bench.bandwidth import BandwidthProbe
from swiftlm.core.structured import StructuredOutput
from swiftlm.runner.structured import check

LONG = {"type": "object", "properties": {"items": {"type": "array", "minItems": 200, "maxItems": 400,
        "items": {"type": "string", "maxLength": 12}}}, "required": ["items"]}
TEST_SCHEMA = {  # the shape of the tests' schema: nested objects, bounded arrays, enums, patterns
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20, "pattern": "^[A-Za-z ]+$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                      "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"]},
    },
    "required": ["name", "age", "tags", "address"],
}


SAMPLING = {  # --sampling: greedy, or Qwen3's recommended non-thinking settings
    "greedy": {"temperature": 0.0},
    "qwen3": {"temperature": 0.7, "top_p": 0.8, "top_k": 20},
}


def decode_rate(llm: LLM, batch: int, decode: int, constraint: StructuredOutput | None, seed: int,
                sampling: str = "greedy") -> float:
    g = torch.Generator().manual_seed(seed)
    prompts = [{"prompt_token_ids": torch.randint(1000, 100000, (32,), generator=g).tolist()} for _ in range(batch)]

    def timed(max_tokens: int) -> tuple[float, int]:
        params = SamplingParams(**SAMPLING[sampling], max_tokens=max_tokens, ignore_eos=constraint is None,
                                structured_outputs=constraint, seed=seed)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t0, sum(len(o.outputs[0].token_ids) for o in outs)

    first, _ = timed(1)
    whole, tokens = timed(decode + 1)
    return (tokens - batch) / (whole - first)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--decode", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sampling", choices=sorted(SAMPLING), default="greedy")
    args = ap.parse_args()
    torch.set_num_threads(2)
    for name, schema in (("test schema", TEST_SCHEMA), ("long array", LONG)):
        so = StructuredOutput("json_schema", json.dumps(schema))
        t0 = time.perf_counter()
        check(so)
        print(f"compile + check, {name}: {1e3 * (time.perf_counter() - t0):.2f} ms")
    llm = LLM(args.model, dtype="bfloat16", kv_cache_memory=1 << 30, enable_prefix_caching=False, max_model_len=2048)
    constraint = StructuredOutput("json_schema", json.dumps(LONG))
    decode_rate(llm, 2, 4, constraint, 0)  # warm-up: the grammar tokenizer, first-call allocations
    probe = BandwidthProbe()
    rows = []
    for batch in args.batch:
        free, grammar, bandwidth = [], [], []
        for rep in range(args.repeats):
            bandwidth.append(probe.measure(3))
            order = [(None, free), (constraint, grammar)]
            for c, out in order if rep % 2 == 0 else order[::-1]:
                out.append(decode_rate(llm, batch, args.decode, c, seed=rep, sampling=args.sampling))
        f, g = statistics.median(free), statistics.median(grammar)
        paired = statistics.median(b / a for a, b in zip(free, grammar, strict=True))
        rows.append((batch, f, g, paired, statistics.median(bandwidth)))
    print(f"bf16, prompt 32, {args.decode} decoded tokens, {args.sampling}, {args.repeats} repeats, medians")
    print("| batch | unconstrained tok/s | json_schema tok/s | ratio of medians | median of paired ratios |"
          " bandwidth GB/s |\n|---:|---:|---:|---:|---:|---:|")
    for batch, f, g, paired, bw in rows:
        print(f"| {batch} | {f:.1f} | {g:.1f} | {g / f:.3f} | {paired:.3f} | {bw:.1f} |")


if __name__ == "__main__":
    main()
