"""Numerical cost of weight-only quantisation: next-token distributions of int8 and int4 against
bf16 on a fixed token set (teacher-forced: the same tokens go into every model).

    python benchmarks/quality/quant_accuracy.py models/qwen3-0.6b-random [--sequences 8] [--length 256]

For every position of every sequence: KL(bf16 || quantised) of the softmax distributions, and
whether the argmax agrees. The same numbers for float32 against bf16 show how sensitive the model
is to rounding at all (random networks are: their logits are nearly flat). With random weights this is a numerical check of the quantisers and
kernels (how far their outputs move), not a statement about the quality of a trained model.
Each model runs the CPU backend's own transformations (``CpuBackend.prepare``: fused projections,
the quantised linears with their kernels) over a dense attention.
"""

from __future__ import annotations

import argparse
import json

import torch

from swiftlm.backends.attention import DenseAttention
from swiftlm.backends.cpu.backend import CpuBackend
from swiftlm.model.loader import load_model


@torch.inference_mode()
def logits_for(model, sequences: list[list[int]]) -> list[torch.Tensor]:
    out = []
    for i, seq in enumerate(sequences):
        attention = DenseAttention(model.config.num_hidden_layers)
        ids = torch.tensor(seq)
        hidden = model(ids, torch.arange(len(seq)), attention.bind([f"s{i}"], [len(seq)]))
        out.append(model.compute_logits(hidden))  # [L, V] float32
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(args.seed)
    sequences = [torch.randint(0, 151643, (args.length,), generator=g).tolist() for _ in range(args.sequences)]
    results = {}
    reference = None
    # float32 first as a yardstick: how far bf16 rounding alone moves this model's distributions
    for dtype, method in (("bfloat16", None), ("float32", None), ("bfloat16", "int8"), ("bfloat16", "int4")):
        model = load_model(args.model, dtype)
        CpuBackend().prepare(model, method)
        method = method or dtype
        logits = logits_for(model, sequences)
        del model
        if reference is None:
            reference = logits
            continue
        kls, agree = [], []
        for ref, got in zip(reference, logits, strict=True):
            p_log, q_log = torch.log_softmax(ref.double(), -1), torch.log_softmax(got.double(), -1)
            kls.append((p_log.exp() * (p_log - q_log)).sum(-1))
            agree.append(ref.argmax(-1) == got.argmax(-1))
        kl, top1 = torch.cat(kls), torch.cat(agree).double()
        results[method] = {"positions": kl.numel(), "kl_mean": kl.mean().item(), "kl_median": kl.median().item(),
                           "kl_p99": kl.quantile(0.99).item(), "top1_agreement": top1.mean().item()}
        print(f"{method} vs bf16 over {kl.numel()} positions: KL mean {kl.mean():.4g}, median {kl.median():.4g}, "
              f"p99 {kl.quantile(0.99):.4g}; top-1 agreement {top1.mean():.2%}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
