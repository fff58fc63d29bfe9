"""A streamed answer against the same answer whole, end to end over HTTP, with the openai SDK.

    swiftlm serve models/qwen3-0.6b-random --dtype bfloat16 --port 8011 &
    .venv/bin/python benchmarks/server/stream_vs_whole.py --base-url http://127.0.0.1:8011/v1 --pairs 15

One request at a time (concurrency 1), the same chat prompt and a fixed answer length (``ignore_eos``,
greedy, ``--tokens``), alternately streamed (``stream=True``, read to the last chunk) and whole, the
order reversing every pair. Prints the median end-to-end seconds of each, the median of the per-pair
ratios streamed / whole, and checks that both gave the same text. Acceptance: ratio <= 1.05.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from openai import OpenAI


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8011/v1")
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--tokens", type=int, default=96)
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="none")
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]
    extra = {"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}}

    def whole() -> tuple[float, str]:
        t0 = time.perf_counter()
        out = client.chat.completions.create(model=model, messages=messages, max_tokens=args.tokens,
                                             temperature=0, extra_body=extra)
        return time.perf_counter() - t0, out.choices[0].message.content or ""

    def streamed() -> tuple[float, str]:
        t0 = time.perf_counter()
        text = []
        for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=args.tokens,
                                                    temperature=0, extra_body=extra, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
        return time.perf_counter() - t0, "".join(text)

    whole(), streamed()  # warm-up
    times: dict[str, list[float]] = {"whole": [], "streamed": []}
    ratios = []
    for i in range(args.pairs):
        order = (("whole", whole), ("streamed", streamed)) if i % 2 == 0 else (("streamed", streamed), ("whole", whole))
        got = {}
        for name, fn in order:
            seconds, text = fn()
            times[name].append(seconds)
            got[name] = text
        assert got["whole"] == got["streamed"], "streamed and whole answers differ"
        ratios.append(times["streamed"][-1] / times["whole"][-1])
    result = {"tokens": args.tokens, "pairs": args.pairs,
              "whole_s": round(statistics.median(times["whole"]), 4),
              "streamed_s": round(statistics.median(times["streamed"]), 4),
              "ratio_median": round(statistics.median(ratios), 4),
              "ratios": [round(r, 3) for r in ratios]}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
