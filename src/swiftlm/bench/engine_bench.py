"""``swiftlm bench engine``: in-process prefill and decode speed, with the bandwidth bound.

Drives ``Engine.step()`` directly (no HTTP, no asyncio) on random prompts with ``ignore_eos`` so
lengths are fixed. For each (batch size, context length) it reports time to first token, prefill
tokens/s, aggregate decode tokens/s, and the fraction of the memory-bandwidth bound reached: a
decode step must at least stream every weight once plus each request's KV, so

    bound_tok_s = batch * bandwidth / (weight_bytes + batch * context * kv_bytes_per_token)
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from itertools import count
from pathlib import Path

import torch

from swiftlm.backends.kv_cache import bytes_per_block
from swiftlm.bench.bandwidth import BandwidthProbe
from swiftlm.core.generation import GenerationRequest
from swiftlm.engine.engine import Engine
from swiftlm.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class EnginePoint:
    batch: int
    context: int
    ttft_s: float  # the whole batch's prefill
    prefill_tok_s: float
    decode_tok_s: float  # aggregate over the batch
    decode_step_ms: float
    bandwidth_gb_s: float  # probe, around the segment
    bound_tok_s: float
    bound_fraction: float


def _memory_key(t: torch.Tensor) -> tuple[int, int]:
    """Where a tensor's bytes are: views of one memory count once (oneDNN's packed weights have
    no storage to point at, and are never shared)."""
    nbytes = t.numel() * t.element_size()
    try:
        return t.data_ptr(), nbytes
    except RuntimeError:
        return id(t), nbytes


def streamed_weight_bytes(engine: Engine) -> int:
    """Bytes a decode step reads: every weight once (quantised buffers included) except the
    embedding table, of which a step gathers a few rows, unless the lm_head reads that same
    memory (tied, unpacked)."""
    model = engine.model
    tensors = [t for _, t in model.named_parameters()]
    tensors += [t for name, t in model.named_buffers() if "rotary" not in name]
    sizes = dict(_memory_key(t) for t in tensors)  # memory -> bytes, each memory once
    embed = _memory_key(model.model.embed_tokens.weight)
    head = {_memory_key(t) for t in (*model.lm_head.parameters(), *model.lm_head.buffers())}
    total = sum(sizes.values())
    if embed not in head:
        total -= embed[1]
    return total


def kv_bytes_per_token(engine: Engine) -> int:
    """K and V of one token, every layer (8-bit caches: values and scales)."""
    cache = engine.kv_cache
    return bytes_per_block(engine.model.config, 1, cache.dtype, cache.fmt)


def run_point(engine: Engine, probe: BandwidthProbe, batch: int, context: int, decode_tokens: int, seed: int) -> EnginePoint:
    g = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=0.0, max_tokens=decode_tokens + 1, ignore_eos=True)
    ids = count()
    bw_before = probe.measure()
    pending = set()
    t0 = time.perf_counter()
    for _ in range(batch):
        rid = f"bench-{seed}-{next(ids)}"
        prompt = torch.randint(0, 151000, (context,), generator=g).tolist()
        engine.add_request(GenerationRequest(rid, prompt, params))
        pending.add(rid)
    first: set[str] = set()
    while len(first) < batch:
        for out in engine.step():
            if out.outputs and out.outputs[0].token_ids:
                first.add(out.request_id)
    ttft = time.perf_counter() - t0
    t1 = time.perf_counter()
    steps = 0
    while pending:
        steps += 1
        for out in engine.step():
            if out.finished:
                pending.discard(out.request_id)
    decode_s = time.perf_counter() - t1
    bw = (bw_before + probe.measure()) / 2
    decode_tok_s = batch * decode_tokens / decode_s
    step_bytes = streamed_weight_bytes(engine) + batch * (context + decode_tokens // 2) * kv_bytes_per_token(engine)
    bound = batch * bw * 1e9 / step_bytes
    return EnginePoint(
        batch=batch, context=context, ttft_s=ttft, prefill_tok_s=batch * context / ttft,
        decode_tok_s=decode_tok_s, decode_step_ms=decode_s / max(steps, 1) * 1000, bandwidth_gb_s=bw,
        bound_tok_s=bound, bound_fraction=decode_tok_s / bound,
    )


def median_point(points: list[EnginePoint]) -> EnginePoint:
    fields = {k: statistics.median(getattr(p, k) for p in points) for k in asdict(points[0])}
    fields["batch"], fields["context"] = points[0].batch, points[0].context
    return EnginePoint(**fields)


def run_engine_bench(
    engine: Engine, batches: list[int], contexts: list[int], decode_tokens: int, repeats: int
) -> list[EnginePoint]:
    probe = BandwidthProbe()
    run_point(engine, probe, 1, 16, 4, seed=0)  # warm-up: allocator, kernels, caches
    results = []
    for context in contexts:
        for batch in batches:
            reps = [run_point(engine, probe, batch, context, decode_tokens, seed=1000 * r + batch) for r in range(repeats)]
            results.append(median_point(reps))
    return results


def render_table(points: list[EnginePoint]) -> str:
    lines = [
        "| batch | context | TTFT s | prefill tok/s | decode tok/s | step ms | bandwidth GB/s | bound tok/s | of bound |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        lines.append(
            f"| {p.batch} | {p.context} | {p.ttft_s:.3f} | {p.prefill_tok_s:.0f} | {p.decode_tok_s:.1f} | "
            f"{p.decode_step_ms:.1f} | {p.bandwidth_gb_s:.0f} | {p.bound_tok_s:.1f} | {p.bound_fraction:.0%} |"
        )
    return "\n".join(lines)


def write_json(points: list[EnginePoint], path: Path, meta: dict) -> None:
    path.write_text(json.dumps({"meta": meta, "points": [asdict(p) for p in points]}, indent=2))
