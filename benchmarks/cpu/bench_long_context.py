"""Decode at long contexts, per KV cache dtype, on a synthetic cache (no minutes of prefill).

    OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores .venv/bin/python benchmarks/cpu/bench_long_context.py \\
        models/qwen3-0.6b-random --contexts 32 2048 8192 32768 --repeats 5

One engine (bf16 weights) and, per ``--kv-cache-dtype`` (auto, int8, fp8_e4m3, fp8_e5m2), its own KV
cache of ``max(contexts)`` tokens on huge pages, filled with random K/V through the cache's own store
(so 8-bit pools hold real quantised rows). For each (context, dtype), interleaved and rotating:

* **step**: one decode step of a single request whose context is that long (the backend's forward:
  the decode layers op, or the per-layer loop, and the lm_head), median ms -> tok/s;
* **attention**: the 28 layers' decode attention calls alone at that context, median ms, and the
  GB/s of K/V (values and scales) they read. With the kernel they are made back to back from C++
  (``paged_decode_attention_layers``), as the step's decode op makes them; the same calls made one
  by one from Python (each paying the interpreter's path, cold after the pools streamed through the
  caches: 6-25 us more a call on a Zen4 VM) are timed too, as "Python loop";
* **weights**: the GB/s at which the same run streams the weights: streamed weight bytes / the
  step time at the shortest context, minus that step's attention time.

The ratios (K/V GB/s against the weights' GB/s, decode against decode at the shortest context) are
taken within each round from measurements made back to back: a round takes each (dtype, blocks)
group in turn (rotating), probes the bandwidth, then times its contexts' steps interleaved step by
step, then their attention calls the same way. Memory bandwidth here can swing 1.6x from one minute to
the next, so ratios of medians taken minutes apart can mix a fast minute with a slow one; the table's
ratios are medians of the per-round ratios, also split into the rounds of slower and faster probed
bandwidth (``--json`` keeps every round).

Blocks are shuffled by default (the worst case of a long-lived server); ``--block-order sequential``
gives the request ascending block ids, as a fresh pool hands them out, and ``descending`` descending
ones (the pool frees a finished request's blocks tail first, so the next request would get its run of
ids backwards if the pool handed them out in queue order). Several orders (``--block-order sequential
shuffled``) or block sizes (``--block-sizes 16 64``; by default the backend's for each dtype, as the
engine takes it) compare in the same interleaved run. A memory-bandwidth probe brackets each round.
Prints one markdown table and the ratios the long-context issue asks for; ``--json`` writes all.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from swiftlm import LLM
from swiftlm.backends.kv_cache import bytes_per_block
from swiftlm.backends.kv_quant import kv_format
from swiftlm.bench.bandwidth import BandwidthProbe
from swiftlm.bench.engine_bench import streamed_weight_bytes
from swiftlm.core.step import AttentionMetadata

DTYPES = ("auto", "int8", "fp8_e4m3", "fp8_e5m2")
ORDERS = ("shuffled", "sequential", "descending")


def fill(cache, n_tokens: int, g: torch.Generator) -> None:
    """Random K/V (unit normal, as normed keys are) for slots 0 .. n_tokens, every layer."""
    k_pool = cache.layer(0)[0]
    n_kv, d = k_pool.shape[2], k_pool.shape[3]
    for layer in range(len(cache.pools()[0])):
        for lo in range(0, n_tokens, 4096):
            hi = min(n_tokens, lo + 4096)
            k = torch.randn(hi - lo, n_kv, d, generator=g).to(cache.dtype)
            v = torch.randn(hi - lo, n_kv, d, generator=g).to(cache.dtype)
            cache.store(layer, torch.arange(lo, hi), k, v)


class Point:
    """One request decoding at ``context`` over one cache: its step and its attention calls."""

    def __init__(self, llm: LLM, cache, attention, context: int, table: torch.Tensor) -> None:
        engine = llm.engine
        self.engine, self.cache, self.context = engine, cache, context
        bs = cache.block_size
        n_blocks = (context + bs - 1) // bs
        blocks = table[:n_blocks]
        slot = int(blocks[(context - 1) // bs]) * bs + (context - 1) % bs
        self.meta = AttentionMetadata(query_start=[0, 1], seq_lens=[context], slot_mapping=torch.tensor([slot]),
                                      block_tables=blocks.view(1, -1).clone(), decode_rows=[0], prefill_rows=[])
        self.attention = attention
        self.ids, self.pos = torch.tensor([1000]), torch.tensor([context - 1])
        self.kernel = engine.backend.decode_kernel
        cfg = engine.model.config
        self.q = torch.randn(1, cfg.num_attention_heads, cfg.head_dim).to(cache.dtype)
        self.layers_args = None  # the layers op's arguments, with the kernel
        decode = attention.bind(self.meta).decode
        if getattr(decode, "kernel", None) is not None:
            n_layers = len(cache.pools()[0])
            pools = [cache.layer(i) for i in range(n_layers)]
            scales = [cache.layer_scales(i) for i in range(n_layers)]
            self.layers_args = (self.q, [k for k, _ in pools], [v for _, v in pools], decode.block_tables,
                                decode.seq_lens, cfg.head_dim ** -0.5,
                                [s[0] for s in scales if s is not None], [s[1] for s in scales if s is not None])

    @torch.inference_mode()
    def step_s(self) -> float:
        e = self.engine
        t0 = time.perf_counter()
        hidden = e.backend.forward(e.model, self.ids, self.pos, self.attention.bind(self.meta))
        e.model.lm_head(hidden).argmax(-1)
        return time.perf_counter() - t0

    @torch.inference_mode()
    def attention_s(self) -> float:
        """The decode attention of every layer as a step calls it: the kernel's calls back to back from
        C++, else the Python loop (the torch path)."""
        if self.layers_args is None:
            return self.attention_py_s()
        t0 = time.perf_counter()
        torch.ops.swiftlm_attention.paged_decode_attention_layers(*self.layers_args)
        return time.perf_counter() - t0

    @torch.inference_mode()
    def attention_py_s(self) -> float:
        """The decode attention of every layer, called layer by layer from Python."""
        bound = self.attention.bind(self.meta)
        t0 = time.perf_counter()
        for layer in range(len(self.cache.pools()[0])):
            bound.decode.attend(self.q, self.cache, layer)
        return time.perf_counter() - t0

    def kv_bytes(self) -> int:
        """K/V bytes (values and scales) of the context, every layer."""
        return self.context * bytes_per_block(self.engine.model.config, 1, self.cache.dtype, self.cache.fmt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--contexts", type=int, nargs="+", default=[32, 2048, 8192, 32768])
    ap.add_argument("--kv-cache-dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    ap.add_argument("--repeats", type=int, default=5, help="rounds; each takes the median of --steps")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--block-order", nargs="+", choices=ORDERS, default=["shuffled"],
                    help="the request's block ids: shuffled, or ascending as a fresh pool allocates them")
    ap.add_argument("--block-sizes", nargs="+", default=["default"],
                    help="KV cache block sizes (tokens) to compare, each with its own caches; 'default': the "
                         "backend's for each dtype, as the engine takes it (16; 32 for the 8-bit caches on a CPU)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    max_ctx = max(args.contexts)
    llm = LLM(args.model, dtype="bfloat16", num_blocks=16)  # its own cache unused: each dtype gets one below
    engine = llm.engine
    cfg = engine.model.config
    g = torch.Generator().manual_seed(0)
    # block ids, never the null block: shuffled (a long-lived server's worst case), or in the order a
    # fresh pool hands them out (ascending; a request's blocks freed together are evicted together)
    points: dict[tuple[int, str, tuple[int, str]], Point] = {}
    combos = [(bs, order) for bs in args.block_sizes for order in args.block_order]
    for size in args.block_sizes:
        for name in args.kv_cache_dtypes:
            bs = engine.backend.default_block_size(kv_format(name)) if size == "default" else int(size)
            n_blocks = -(-max_ctx // bs) + 2
            tables = {"shuffled": torch.randperm(n_blocks - 1, generator=g) + 1,
                      "sequential": torch.arange(n_blocks - 1) + 1,
                      "descending": torch.arange(n_blocks - 1, 0, -1)}
            cache = engine.backend.allocate_kv_cache(cfg, n_blocks, bs, torch.bfloat16, kv_format(name))
            fill(cache, n_blocks * bs, g)
            attention = engine.backend.attention(cache)
            for ctx in args.contexts:
                for order in args.block_order:
                    points[(ctx, name, (size, order))] = Point(llm, cache, attention, ctx, tables[order])
    weight_bytes = streamed_weight_bytes(engine)
    probe = BandwidthProbe()
    short = min(args.contexts)
    i0 = args.contexts.index(short)
    groups = [(name, combo) for combo in combos for name in args.kv_cache_dtypes]
    for p in points.values():  # warm-up
        p.step_s()
        p.attention_s()
    rounds: list[dict] = []  # one per (round, group): its probe, its medians, its paired ratios
    for rep in range(args.repeats):
        rotated = groups[rep % len(groups):] + groups[: rep % len(groups)]
        for name, combo in rotated if rep % 2 == 0 else rotated[::-1]:
            pts = [points[(ctx, name, combo)] for ctx in args.contexts]
            gbs = probe.measure()
            step: list[list[float]] = [[] for _ in pts]
            attn: list[list[float]] = [[] for _ in pts]
            attn_py: list[list[float]] = [[] for _ in pts]
            for s in range(args.steps):  # contexts interleaved step by step, the order alternating
                for i in range(len(pts)) if s % 2 == 0 else reversed(range(len(pts))):
                    step[i].append(pts[i].step_s())
            for s in range(args.steps):
                for i in range(len(pts)) if s % 2 == 0 else reversed(range(len(pts))):
                    attn[i].append(pts[i].attention_s())
                    attn_py[i].append(pts[i].attention_py_s())
            st = [statistics.median(x) for x in step]
            at = [statistics.median(x) for x in attn]
            at_py = [statistics.median(x) for x in attn_py]
            weights_gbs = weight_bytes / (st[i0] - at[i0]) / 1e9
            rounds.append({"round": rep, "kv_cache_dtype": name, "block_size": pts[0].cache.block_size,
                           "block_sizes_arg": combo[0], "block_order": combo[1],
                           "bandwidth_gb_s": gbs, "weights_gb_s": weights_gbs,
                           "contexts": {ctx: {"step_s": st[i], "attention_s": at[i], "attention_py_s": at_py[i],
                                              "kv_share": pts[i].kv_bytes() / at[i] / 1e9 / weights_gbs,
                                              "relative_to_short": st[i0] / st[i]}
                                        for i, ctx in enumerate(args.contexts)}})
        print(f"round {rep + 1}/{args.repeats} done", flush=True)

    def halves(rs: list[dict]) -> tuple[list[dict], list[dict]]:
        """The rounds of slower and of faster probed bandwidth (the middle one in both when odd)."""
        ranked = sorted(rs, key=lambda r: r["bandwidth_gb_s"])
        return ranked[: (len(ranked) + 1) // 2], ranked[len(ranked) // 2:]

    def med(rs: list[dict], ctx: int, key: str) -> float:
        return statistics.median(r["contexts"][ctx][key] for r in rs)

    many = True  # the block size differs by dtype by default
    lines = ["| kv cache |" + (" blocks |" if many else "") + " context | decode tok/s | step ms | attention ms (28 layers) "
             f"| K/V GB/s | of weights GB/s: all (slower, faster rounds) | K/V GB/s, Python loop "
             f"| vs context {short}: all (slower, faster) |",
             "|---|" + ("---:|" if many else "") + "---:|---:|---:|---:|---:|---:|---:|---:|"]
    rows, out = [], []
    for combo in combos:
        for name in args.kv_cache_dtypes:
            rs = [r for r in rounds if r["kv_cache_dtype"] == name and (r["block_sizes_arg"], r["block_order"]) == combo]
            bs = rs[0]["block_size"]
            slow, fast = halves(rs)
            for ctx in args.contexts:
                p = points[(ctx, name, combo)]
                step_s, attn_s = med(rs, ctx, "step_s"), med(rs, ctx, "attention_s")
                kv_gbs = p.kv_bytes() / attn_s / 1e9
                kv_py_gbs = p.kv_bytes() / med(rs, ctx, "attention_py_s") / 1e9
                share = [med(x, ctx, "kv_share") for x in (rs, slow, fast)]
                rel = [med(x, ctx, "relative_to_short") for x in (rs, slow, fast)]
                lines.append(f"| {name} |" + (f" {bs}, {combo[1]} |" if many else "") + f" {ctx} | {1 / step_s:.1f} | "
                             f"{step_s * 1e3:.1f} | {attn_s * 1e3:.2f} | {kv_gbs:.1f} | "
                             f"{share[0]:.0%} ({share[1]:.0%}, {share[2]:.0%}) | {kv_py_gbs:.1f} | {rel[0]:.0%} ({rel[1]:.0%}, {rel[2]:.0%}) |")
                out.append({"kv_cache_dtype": name, "block_size": bs, "block_order": combo[1], "context": ctx,
                            "step_s": step_s, "attention_s": attn_s, "kv_bytes": p.kv_bytes(), "kv_gb_s": kv_gbs,
                            "kv_gb_s_python_loop": kv_py_gbs,
                            "kv_share": share, "relative_to_short": rel, "decode_tok_s": 1 / step_s})
            w = [statistics.median(r["weights_gb_s"] for r in x) for x in (rs, slow, fast)]
            b = [statistics.median(r["bandwidth_gb_s"] for r in x) for x in (slow, fast)]
            rows.append(f"- {name}" + (f", blocks of {bs}, {combo[1]}" if many else "") +
                        f": weights stream at {w[0]:.1f} GB/s ({w[1]:.1f} in the slower rounds, probe {b[0]:.1f}; "
                        f"{w[2]:.1f} in the faster, probe {b[1]:.1f}; {weight_bytes / 1e9:.2f} GB a step)")
    print("\n".join(lines))
    print("\n".join(rows))
    bandwidth = [r["bandwidth_gb_s"] for r in rounds]
    print(f"- bandwidth probe: {min(bandwidth):.1f}-{max(bandwidth):.1f} GB/s (median {statistics.median(bandwidth):.1f})")
    if args.json:
        args.json.write_text(json.dumps({"points": out, "rounds": rounds, "args": vars(args) | {"json": str(args.json)}},
                                        indent=1))


if __name__ == "__main__":
    main()
