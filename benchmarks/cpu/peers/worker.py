"""One engine of the CPU peer benchmark, driven over stdin / stdout (see run.py).

    python worker.py swiftlm MODEL_DIR [--quantization int8|int4] [--disable-kernels gemv,attention,...]
    python worker.py hf MODEL_DIR
    python worker.py llama MODEL.gguf [--flash-attn] [--no-extra-bufts]

It loads the model once, prints {"ready": true, "load_s": ...}, then answers each request line
{"prompt": [token ids], "decode": D} with {"ttft_s": ..., "decode_tok_s": ...}: greedy, single
request, TTFT = prompt in to first token sampled, decode = the next D tokens one at a time. A request
with ``"batch": B`` (swiftlm only) also answers ``batch_decode_tok_s``: B prompts decoded together,
the generated tokens after the first of each per second (the time of B first tokens subtracted).
Runs under the project's venv (swiftlm, hf) or the llama-cpp-python venv (llama): only that
engine's package is imported.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def swiftlm_engine(args: argparse.Namespace):
    import torch

    from swiftlm import LLM, SamplingParams

    torch.set_num_threads(args.threads)
    extra = {"kv_cache_dtype": args.kv_cache_dtype} if args.kv_cache_dtype else {}  # older trees lack the field
    if args.block_size:
        extra["block_size"] = args.block_size
    if args.disable_kernels:  # the torch path for these kernels, and no oneDNN packing (older trees lack both)
        extra |= {"cpu_disable_kernels": tuple(args.disable_kernels.split(",")), "cpu_prepack": False}
    # --reuse-prompt: a prompt sent again is served from the prefix cache (only its last partial block
    # is computed again), so repeated decodes at one long context skip its prefill
    llm = LLM(args.model, dtype="bfloat16", quantization=args.quantization, kv_cache_memory=1 << 30,
              enable_prefix_caching=args.reuse_prompt, max_model_len=4096, **extra)

    def run(prompt: list[int], decode: int) -> tuple[float, float]:
        params = SamplingParams(temperature=0.0, max_tokens=decode + 1, ignore_eos=True)
        t0 = time.perf_counter()
        t_first = None
        for out in llm.stream({"prompt_token_ids": prompt}, params):
            if t_first is None and out.outputs and out.outputs[0].token_ids:
                t_first = time.perf_counter()
        return t_first - t0, decode / (time.perf_counter() - t_first)

    def run_batch(prompt: list[int], decode: int, batch: int) -> float:
        # B distinct prompts of the same length (no prefix sharing), all admitted in the first step
        prompts = [{"prompt_token_ids": [(t + 7919 * i) % 150000 for t in prompt]} for i in range(batch)]

        def timed(max_tokens: int) -> float:
            t0 = time.perf_counter()
            llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                         use_tqdm=False)
            return time.perf_counter() - t0

        first = timed(1)
        return batch * decode / (timed(decode + 1) - first)

    run.batch = run_batch
    return run


def hf_engine(args: argparse.Namespace):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, attn_implementation="sdpa").eval()

    @torch.inference_mode()
    def run(prompt: list[int], decode: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        out = model(torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
        token = out.logits[0, -1].argmax().view(1, 1)
        t1 = time.perf_counter()
        past = out.past_key_values
        for _ in range(decode):
            out = model(token, past_key_values=past, use_cache=True)
            past, token = out.past_key_values, out.logits[0, -1].argmax().view(1, 1)
        return t1 - t0, decode / (time.perf_counter() - t1)

    return run


def llama_engine(args: argparse.Namespace):
    import numpy as np

    if args.no_extra_bufts:  # AMX buffers crash quantized GGUFs on this CPU: see benchmarks/peers/llama_server.py
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "peers"))
        from llama_server import disable_extra_bufts

        disable_extra_bufts()
    from llama_cpp import Llama

    kv = {}
    if args.kv_cache_dtype == "q8_0":  # llama.cpp's 8-bit KV cache (GGML_TYPE_Q8_0 = 8; V needs flash attention)
        kv = {"type_k": 8, "type_v": 8}
    llm = Llama(model_path=args.model, n_ctx=4096, n_batch=512, n_ubatch=512, n_threads=args.threads,
                n_threads_batch=args.threads, flash_attn=args.flash_attn, logits_all=False, verbose=False, **kv)

    n_vocab = llm.n_vocab()

    def last_logits():  # the context's output row (logits_all=False keeps only the last position)
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))

    previous: list[list[int]] = [[]]

    def run(prompt: list[int], decode: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        if args.reuse_prompt and prompt == previous[0]:
            # the same prompt again: back to its last token (eval drops the KV cache past n_tokens),
            # which is computed again for its logits
            llm.n_tokens = len(prompt) - 1
            llm.eval(prompt[-1:])
        else:
            llm.reset()
            llm.eval(prompt)
            previous[0] = list(prompt)
        token = int(np.argmax(last_logits()))
        t1 = time.perf_counter()
        for _ in range(decode):
            llm.eval([token])
            token = int(np.argmax(last_logits()))
        return t1 - t0, decode / (time.perf_counter() - t1)

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("engine", choices=("swiftlm", "hf", "llama"))
    parser.add_argument("model")
    parser.add_argument("--quantization")
    parser.add_argument("--kv-cache-dtype", help="swiftlm: auto|int8|fp8|fp8_e5m2; llama: q8_0 (with --flash-attn)")
    parser.add_argument("--block-size", type=int, help="swiftlm: KV block size in tokens (default: the engine's)")
    parser.add_argument("--disable-kernels", help="swiftlm: comma-separated CPU kernels left out (ops.KERNELS)")
    parser.add_argument("--flash-attn", action="store_true")
    parser.add_argument("--no-extra-bufts", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reuse-prompt", action="store_true",
                        help="serve a repeated prompt from the engine's cache (swiftlm: prefix caching on; llama: "
                             "its context rewound to the prompt's end) instead of computing it again")
    args = parser.parse_args()
    t0 = time.perf_counter()
    run = {"swiftlm": swiftlm_engine, "hf": hf_engine, "llama": llama_engine}[args.engine](args)
    run(list(range(1000, 1016)), 2)  # warm-up: first-call allocations and kernel setup
    print(json.dumps({"ready": True, "load_s": time.perf_counter() - t0}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        ttft, decode_tok_s = run(request["prompt"], request["decode"])
        answer = {"ttft_s": ttft, "decode_tok_s": decode_tok_s}
        if request.get("batch"):
            answer["batch_decode_tok_s"] = run.batch(request["prompt"], request["decode"], request["batch"])
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
