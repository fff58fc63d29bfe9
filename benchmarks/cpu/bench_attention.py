"""Paged decode attention, kernel vs torch path, per layer call on the Qwen3-0.6B shape.

    python benchmarks/cpu/bench_attention.py [--dtype bfloat16] [--configs 1x32,1x512,...] [--threads N]

Each configuration (B requests x context) gets 28 layers of K/V pools with shuffled block ids;
a timed pass calls every layer once (as a decode step does), so K/V come from memory, not cache.
Kernel and torch passes are interleaved (K, T, T, K) and bracketed by a read-bandwidth probe;
one JSON line per configuration reports microseconds per call, GB/s of K/V streamed, and the
bandwidth bound. Set THP_MEM_ALLOC_ENABLE=1 to put the pools on huge pages (as the engine should).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from swiftlm.backends.cpu.kernels.attention_cpu import load_paged_attention

HQ, HKV, D, BLOCK, LAYERS = 16, 8, 128, 16, 28


def probe_read_gbps(buf: torch.Tensor, passes: int = 5) -> float:
    best = float("inf")
    for _ in range(passes):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return buf.numel() * buf.element_size() / best / 1e9


def torch_decode(q, k_pool, v_pool, tables, mask):
    """The engine's plain path: gather the blocks, SDPA with a length mask."""
    b = q.shape[0]
    k = k_pool[tables].view(b, -1, HKV, D).transpose(1, 2)  # [B, Hkv, L, D]
    v = v_pool[tables].view(b, -1, HKV, D).transpose(1, 2)
    return F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, enable_gqa=True).squeeze(2)


def per_call_seconds(fn, pools, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for k, v in pools:
            fn(k, v)
        out.append((time.perf_counter() - t0) / len(pools))
    return out


def run(b: int, ctx: int, dtype: torch.dtype, op, probe_buf: torch.Tensor) -> dict:
    g = torch.Generator().manual_seed(0)
    nb = (ctx + BLOCK - 1) // BLOCK
    pools = [
        tuple(torch.randn(1 + b * nb, BLOCK, HKV, D, generator=g).to(dtype) for _ in range(2))
        for _ in range(LAYERS)
    ]
    tables = (torch.randperm(b * nb, generator=g) + 1).view(b, nb)
    lens = torch.full((b,), ctx, dtype=torch.int64)
    q = torch.randn(b, HQ, D, generator=g).to(dtype)
    mask = (torch.arange(nb * BLOCK) < ctx).view(1, 1, 1, -1).expand(b, 1, 1, -1)
    scale = D**-0.5

    def kern(k, v):
        return op(q, k, v, tables, lens, scale)

    def ref(k, v):
        return torch_decode(q, k, v, tables, mask)

    err = (kern(*pools[0]).float() - ref(*pools[0]).float()).abs().max().item()
    nbytes = b * ctx * HKV * D * 2 * q.element_size()  # K and V, each row once
    reps = max(4, min(100, int(3e8 / (nbytes * LAYERS))))
    per_call_seconds(kern, pools, 1)  # warm-up
    per_call_seconds(ref, pools, 1)
    bw_before = probe_read_gbps(probe_buf)
    k1 = per_call_seconds(kern, pools, reps)
    t1 = per_call_seconds(ref, pools, max(2, reps // 8))
    t2 = per_call_seconds(ref, pools, max(2, reps // 8))
    k2 = per_call_seconds(kern, pools, reps)
    hot = per_call_seconds(kern, [pools[0]] * LAYERS, reps)  # one layer again and again: cache-resident
    bw = max(bw_before, probe_read_gbps(probe_buf))
    kb, tb = min(k1 + k2), min(t1 + t2)
    return {
        "B": b,
        "ctx": ctx,
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "MB_per_call": round(nbytes / 1e6, 3),
        "kernel_us": round(kb * 1e6, 1),
        "kernel_us_median": round(statistics.median(k1 + k2) * 1e6, 1),
        "kernel_GBps": round(nbytes / kb / 1e9, 1),
        "kernel_hot_us": round(min(hot) * 1e6, 1),
        "torch_us": round(tb * 1e6, 1),
        "torch_GBps": round(nbytes / tb / 1e9, 2),
        "speedup": round(tb / kb, 1),
        "probe_GBps": round(bw, 1),
        "bound_us": round(nbytes / (bw * 1e9) * 1e6, 1),
        "fraction_of_bound": round(nbytes / kb / 1e9 / bw, 2),
        "max_abs_diff_vs_torch": err,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--configs", default="1x32,1x512,1x2048,1x8192,16x512", help="BxCTX,...")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    op = load_paged_attention()
    if op is None:
        raise SystemExit("the paged attention kernel is unavailable here (see the log)")
    probe_buf = torch.ones(64 << 20)  # 256 MB
    for spec in args.configs.split(","):
        b, ctx = (int(x) for x in spec.split("x"))
        print(json.dumps(run(b, ctx, getattr(torch, args.dtype), op, probe_buf)), flush=True)


if __name__ == "__main__":
    main()
