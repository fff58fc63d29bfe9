"""llguidance against xgrammar on this CPU: tokenizer setup, schema compile, and the time to fill
one mask in typical JSON states of the structured-output benchmark's schema (medians of 7, fresh
matchers each time).

xgrammar is not a dependency (its Linux wheel requires triton): unpack it next to the venv without
its dependencies, e.g. ``pip download xgrammar apache-tvm-ffi --no-deps -d /tmp/xg``, unzip both
wheels into /tmp/xgt, then

    PYTHONPATH=/tmp/xgt OMP_NUM_THREADS=2 python benchmarks/peers/compare_grammar_engines.py models/qwen3-0.6b-random
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import xgrammar as xgr
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))  # bench_structured
from bench_structured import LONG, TEST_SCHEMA  # noqa: E402

from swiftlm.core.structured import StructuredOutput  # noqa: E402
from swiftlm.runner.structured import GrammarCompiler, check  # noqa: E402
from swiftlm.text.tokenizer import Tokenizer  # noqa: E402

STATES = ('{"items":["', '{"items":["ab', '{"items":["hello wor', '{"items":["abcdefghijk', '{"items":["ab"',
          '{"items":["abc",')


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def popcount(words: torch.Tensor) -> int:
    return sum(bin(w & 0xFFFFFFFF).count("1") for w in words.tolist())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    args = ap.parse_args()
    torch.set_num_threads(2)
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    hf = AutoTokenizer.from_pretrained(args.model)
    tok = Tokenizer.from_dir(args.model)
    info: list = []
    t_xgr = timed(lambda: info.append(xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab)))
    ll = GrammarCompiler(tok, vocab)
    t_ll = timed(lambda: ll.ll_tokenizer)
    print(f"tokenizer setup: xgrammar {t_xgr:.2f} s, llguidance {t_ll:.2f} s")
    compiler = xgr.GrammarCompiler(info[0], max_threads=2, cache_enabled=False)

    def compile_xgr(schema: dict) -> xgr.CompiledGrammar:
        return compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))

    for name, schema in (("test schema", TEST_SCHEMA), ("long array", LONG)):
        so = StructuredOutput("json_schema", json.dumps(schema))
        tx = timed(lambda schema=schema: compile_xgr(schema))
        tl = timed(lambda so=so: (check(so), ll.new_state(so)))
        print(f"compile + first matcher, {name}: xgrammar {1e3 * tx:.1f} ms, llguidance {1e3 * tl:.1f} ms")
    compiled = compile_xgr(LONG)
    so = StructuredOutput("json_schema", json.dumps(LONG))
    xgr_mask = xgr.allocate_token_bitmask(1, vocab)
    ll_mask = torch.empty(xgr_mask.shape[1], dtype=torch.int32)
    print("| state | allowed (xgrammar / llguidance) | xgrammar ms | llguidance ms |\n|---|---:|---:|---:|")
    for text in STATES:
        ids = tok.encode(text)
        xs, ls = [], []
        for _ in range(7):
            matcher = xgr.GrammarMatcher(compiled)
            state = ll.new_state(so)
            for i in ids:
                if not (matcher.accept_token(i) and state.accept(i)):
                    raise SystemExit(f"{text!r}: token {i} refused")
            xs.append(timed(lambda matcher=matcher: matcher.fill_next_token_bitmask(xgr_mask, 0)))
            ls.append(timed(lambda state=state: state.fill_bitmask(ll_mask)))
        print(f"| `{text}` | {popcount(xgr_mask[0])} / {popcount(ll_mask)} | {1e3 * statistics.median(xs):.3f} | "
              f"{1e3 * statistics.median(ls):.3f} |")


if __name__ == "__main__":
    main()
