"""The paged decode attention kernel of another commit against this tree's, interleaved.

    OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores THP_MEM_ALLOC_ENABLE=1 \\
        .venv/bin/python benchmarks/cpu/ab_attention_kernel.py --old HEAD~1 --kv int8 --contexts 2048 8192 32768

The old source (``git show COMMIT:...``, with the headers it includes) is built under another op
namespace, so both kernels load in one process. Per KV dtype and context: pools of the Qwen3-0.6B
shape (16 / 8 heads, head_dim 128) with shuffled blocks (or ascending ones), as many layers as keep the pools far larger
than the cache (``--layers`` to override; 1 keeps them in cache), one bf16 request. Each round times
one call per layer with each kernel, alternating which goes first; prints medians, GB/s of K/V read,
the speed ratio, the two outputs' max difference and a bandwidth probe.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from swiftlm.backends.cpu.kernels.attention_cpu import SOURCE, load_paged_attention
from swiftlm.backends.cpu.kernels.build import load_cpu_op_library, local_includes
from swiftlm.backends.kv_quant import kv_format, quantize_kv
from swiftlm.bench.bandwidth import BandwidthProbe

HQ, HKV, D, BS = 16, 8, 128, 16
REPO = Path(__file__).resolve().parents[2]


def build_old(commit: str, workdir: Path):
    """The kernel of ``commit`` as ``torch.ops.swiftlm_attention_old.paged_decode_attention``."""
    rel = SOURCE.relative_to(REPO)

    def show(path: Path) -> str:
        return subprocess.run(["git", "show", f"{commit}:{path.as_posix()}"], cwd=REPO, check=True,
                              capture_output=True, text=True).stdout

    source = workdir / "paged_attention_old.cpp"
    source.write_text(show(rel).replace("TORCH_LIBRARY(swiftlm_attention,", "TORCH_LIBRARY(swiftlm_attention_old,"))
    for header in local_includes(source):
        header.write_text(show(rel.parent / header.name))
    load_cpu_op_library("ab_attention_old", source)
    return torch.ops.swiftlm_attention_old.paged_decode_attention.default


def pools_for(name: str, ctx: int, layers: int, g: torch.Generator, order: str = "shuffled"):
    n = ctx // BS + 2
    fmt = kv_format(name) if name != "bf16" else None
    out = []
    for _ in range(layers):
        k = torch.randn(n * BS, HKV, D, generator=g)
        v = torch.randn(n * BS, HKV, D, generator=g)
        if fmt is None:
            out.append((k.bfloat16().view(n, BS, HKV, D), v.bfloat16().view(n, BS, HKV, D), None, None))
        else:
            (kq, ks), (vq, vs) = quantize_kv(k, fmt), quantize_kv(v, fmt)
            out.append((kq.view(n, BS, HKV, D), vq.view(n, BS, HKV, D), ks.view(n, BS, HKV), vs.view(n, BS, HKV)))
    ids = torch.randperm(n - 1, generator=g) + 1 if order == "shuffled" else torch.arange(1, n)
    tables = ids[: ctx // BS].view(1, -1)
    return out, tables


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", default="HEAD", help="the commit whose kernel is 'old' (default HEAD)")
    ap.add_argument("--kv", nargs="+", default=["int8"], choices=["bf16", "int8", "fp8_e4m3", "fp8_e5m2"])
    ap.add_argument("--contexts", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--layers", type=int, default=0, help="pools per context (0: 28 at 2048, fewer beyond)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--block-order", choices=["shuffled", "sequential"], default="shuffled",
                    help="the request's block ids: a long-lived pool's (shuffled) or a fresh one's (ascending)")
    args = ap.parse_args()
    new = load_paged_attention()
    if new is None:
        raise SystemExit("the paged attention kernel does not load here")
    with tempfile.TemporaryDirectory() as tmp:
        old = build_old(args.old, Path(tmp))
    probe = BandwidthProbe()
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, HQ, D, generator=g).bfloat16()
    lens_scale = D**-0.5
    for name in args.kv:
        for ctx in args.contexts:
            layers = args.layers or max(2, min(28, 28 * 2048 // ctx))
            pools, tables = pools_for(name, ctx, layers, g, args.block_order)
            lens = torch.tensor([ctx])
            k0, v0, ks0, vs0 = pools[0]
            diff = (old(q, k0, v0, tables, lens, lens_scale, ks0, vs0).float()
                    - new(q, k0, v0, tables, lens, lens_scale, ks0, vs0).float()).abs().max().item()
            times: dict[str, list[float]] = {"old": [], "new": []}
            for r in range(args.rounds):
                order = (("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old))
                for label, op in order:
                    t0 = time.perf_counter()
                    for k, v, ks, vs in pools:
                        op(q, k, v, tables, lens, lens_scale, ks, vs)
                    times[label].append((time.perf_counter() - t0) / layers)
            nbytes = 2 * ctx * HKV * (D * 2 if name == "bf16" else D + 4)
            o, n = statistics.median(times["old"]), statistics.median(times["new"])
            print(f"{name:8s} context {ctx:6d} x {layers:2d} layers: old {o * 1e6:8.1f} us ({nbytes / o / 1e9:5.1f} GB/s)  "
                  f"new {n * 1e6:8.1f} us ({nbytes / n / 1e9:5.1f} GB/s)  new/old speed {o / n:5.3f}  "
                  f"max|diff| {diff:.2e}  probe {probe.measure(3):.1f} GB/s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
