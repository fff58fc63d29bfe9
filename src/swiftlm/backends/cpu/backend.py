"""The CPU backend: swiftlm's compiled kernels where they can run, the torch reference per op where not.

``prepare`` decides everything once, from the kernels that loaded (``CpuKernels``), what each states
it supports, and the model's shape and dtype:

    weights      one huge-page arena in reading order (``weight_arena.py``), q/k/v and gate/up fused
                 as views of it (``backends/fuse.py``)
    linears      bf16: ``GemvLinear`` (GEMV / AMX kernels for decode rows; above: the bf16 GEMM on
                 AVX-512 CPUs without AMX, else oneDNN or F.linear);
                 int8 / int4: ``QuantLinear`` on the VNNI GEMVs; other linears: oneDNN-packed
    elementwise  the fused ops (norms, q/k norm + rotary, SiLU-multiply) through ``StepPlan``
    attention    the paged decode kernel inside ``PagedAttention``; prefill: the paged prefill kernel
                 (AVX512-BF16 CPUs without AMX, bf16 models), else gather + SDPA
    decode step  every layer of a small decode-only step in one C++ call (``DecodeLayers``)

An op whose kernel is missing or does not support the model runs the reference, and the reason is
recorded (``fallbacks``, logged by ``describe``). The row limits are ``limits`` (``RowLimits``).
"""

from __future__ import annotations

import logging
import re
import time
from collections import defaultdict

import torch

from swiftlm.backends.attention import PagedAttention
from swiftlm.backends.base import Backend
from swiftlm.backends.cpu.decode import DecodeLayers
from swiftlm.backends.cpu.host_memory import huge_page_tensors
from swiftlm.backends.cpu.kernels.attention_cpu import instruction_set as attention_isa
from swiftlm.backends.cpu.kernels.attention_cpu import supports as attention_supports
from swiftlm.backends.cpu.kernels.build import dtype_name
from swiftlm.backends.cpu.kernels.decode_cpu import supports as decode_supports
from swiftlm.backends.cpu.kernels.prefill_attention_cpu import instruction_set as prefill_isa
from swiftlm.backends.cpu.kernels.prefill_attention_cpu import supports as prefill_supports
from swiftlm.backends.cpu.limits import GEMV_ROWS_WITHOUT_DENSE_BF16, RowLimits
from swiftlm.backends.cpu.linear import can_pack, pack_linears, use_gemv
from swiftlm.backends.cpu.ops import CpuKernels
from swiftlm.backends.cpu.weight_arena import place_weights_in_arena
from swiftlm.backends.fuse import fuse_projections
from swiftlm.backends.fused_forward import StepPlan, build_plan, fused_forward, fused_ops_support
from swiftlm.backends.kv_cache import KVCache
from swiftlm.backends.kv_quant import KVFormat
from swiftlm.backends.quant import quantize
from swiftlm.backends.row_buckets import warm_row_buckets
from swiftlm.config import ModelConfig
from swiftlm.model.decoder import Attention, DecoderForCausalLM
from swiftlm.platform import cpu_has_bf16

logger = logging.getLogger(__name__)


class CpuBackend(Backend):
    name = "cpu"

    def __init__(
        self, kernels: CpuKernels | None = None, prepack: bool | None = None, disable: tuple[str, ...] = (),
        place_weights: bool = True,
    ) -> None:
        """``kernels``: the loaded kernels (default: every one this CPU runs, less ``disable``).
        ``prepack``: oneDNN-packed weight copies, see ``EngineConfig.cpu_prepack``.
        ``place_weights``: the weight arena (False keeps the weights where loading put them)."""
        super().__init__("cpu")
        self.kernels = kernels if kernels is not None else CpuKernels.load(disable)
        k = self.kernels
        self.limits = RowLimits.for_kernels(
            gemv=k.gemv is not None, amx_capacity=k.amx.max_rows if k.amx is not None else None, quant=k.quant is not None,
            dense_bf16=can_pack(torch.bfloat16), gemm=k.gemm is not None,
        )
        self.prepack = prepack
        self.place_weights = place_weights
        self.step_plan: StepPlan | None = None
        self.decode_kernel = None  # the paged decode attention kernel, when it supports the model
        self.prefill_kernel = None  # the paged prefill attention kernel, when it supports the model
        self.weight_arena: torch.Tensor | None = None  # keeps the placed weights alive
        self.num_kernel_linears = 0

    def resolve_dtype(self, name: str) -> str:
        """``auto`` is bfloat16 on CPUs with native bf16 (as ``platform.resolve_dtype`` says) and also on
        CPUs without it where the bf16 GEMV kernel runs (AVX2 + FMA): it widens bf16 to float32 as it
        reads (a decode step reads half the bytes of float32 weights) and takes prefill rows as a
        float32 GEMM. With AVX2 code on a Zen4 VM (``SWIFTLM_CPU_ISA=avx2``) bf16 decoded 2.6-3.6x as fast as
        float32 and reached the first token 1.0-1.08x as fast (BENCHMARKS.md). Without the kernel (no
        compiler, no AVX2) float32 stays: torch's own bf16 matmul is slow on such CPUs."""
        if name != "auto" or cpu_has_bf16() or self.kernels.gemv is None:
            return super().resolve_dtype(name)
        logger.info("dtype auto -> bfloat16 on cpu (no native bf16: swiftlm's bf16 kernels widen it as they read)")
        return "bfloat16"

    # -- preparing the model -----------------------------------------------------------------------
    def prepare(self, model: DecoderForCausalLM, quantization: str | None = None) -> None:
        cfg = model.config
        dtype = model.model.embed_tokens.weight.dtype
        self.plan, self.fallbacks = [], []
        if quantization is None and self.place_weights:
            # the weights in their final place first, so that fusing q/k/v and gate/up makes views of
            # the arena instead of fresh copies (0.9 GB less memory to touch at load)
            self.weight_arena = place_weights_in_arena(model)
        fuse_projections(model)
        self._prepare_linears(model, dtype, quantization)
        # the streamed weights out of the checkpoint's file mapping, into one buffer in reading order
        if self.place_weights:
            self.weight_arena = place_weights_in_arena(model, self.weight_arena)
        if self.weight_arena is not None:
            self.plan.append(f"weights: one huge-page arena of {self.weight_arena.numel() / 2**20:.0f} MiB "
                             "in reading order")
        self._prepare_attention(cfg, dtype)
        self._prepare_step_plan(model, cfg, dtype)

    def _prepare_linears(self, model: DecoderForCausalLM, dtype: torch.dtype, quantization: str | None) -> None:
        k, limits = self.kernels, self.limits
        if quantization is not None:
            if k.quant is None:
                self.fell_back(f"{quantization} GEMV", k.missing.get("quant", "not loaded"))
            quantize(model, quantization, k.quant, limits.quant_gemv)
            rows = "every row count" if limits.quant_gemv >= GEMV_ROWS_WITHOUT_DENSE_BF16 else \
                f"1-{limits.quant_gemv} rows, dequantise + F.linear above"
            how = f"VNNI GEMV {rows}" if k.quant else "dequantise + F.linear"
            self.plan.append(f"linears: {quantization}, {how}")
        packing = self.prepack is not False and can_pack(dtype)
        if self.prepack is True and not packing:
            self.fell_back("oneDNN prepack", f"oneDNN cannot pack {dtype_name(dtype)} weights on this CPU")
        if k.gemv is None:
            if dtype == torch.bfloat16 and quantization is None:
                self.fell_back("bf16 GEMV", k.missing.get("gemv", "not loaded"))
        elif dtype != torch.bfloat16:
            if quantization is None:
                self.fell_back("bf16 GEMV", f"{dtype_name(dtype)} weights (the kernel takes bfloat16)")
        else:
            extra = self.prepack is True and packing and not limits.gemm  # the GEMM takes those rows
            count, left = use_gemv(model, k.gemv, limits, packed=extra, amx=k.amx.linear if k.amx else None,
                                   gemm=k.gemm.linear if k.gemm else None, gemm_min_rows=k.gemm.min_rows if k.gemm else 1)
            self.num_kernel_linears = count
            if count:
                more = f" (GEMM: {k.gemm.describe()})" if limits.gemm else \
                    "" if limits.gemv_takes_every_row else f", more rows: {'oneDNN packed' if extra else 'F.linear'}"
                self.plan.append(f"linears: {count} bf16 on swiftlm's kernels ({limits.describe_bf16()}){more}")
            for reason, names in _grouped(left).items():
                self.fell_back("bf16 GEMV", f"{names}: {reason}")
        if k.amx is None and k.gemv is not None and dtype == torch.bfloat16 and quantization is None:
            self.fell_back("AMX linear", k.missing.get("amx", "not loaded"))
        if packing:
            packed = pack_linears(model)  # the linears no kernel took
            if packed:
                self.plan.append(f"linears: {packed} oneDNN-packed (prepacked matmul, every row count)")

    def _prepare_attention(self, cfg: ModelConfig, dtype: torch.dtype) -> None:
        k = self.kernels
        reason = k.missing.get("attention", "not loaded") if k.attention is None else \
            attention_supports(dtype, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads)
        self.decode_kernel = k.attention if reason is None else None
        if reason is not None:
            self.fell_back("decode attention", reason)
        reason = k.missing.get("prefill_attention", "not loaded") if k.prefill_attention is None else \
            prefill_supports(dtype, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads)
        self.prefill_kernel = k.prefill_attention if reason is None else None
        if reason is not None:
            self.fell_back("prefill attention", reason)
        if self.decode_kernel is not None or self.prefill_kernel is not None:
            decode = f"{attention_isa()} paged kernel" if self.decode_kernel is not None else "gather + SDPA"
            prefill = f"{prefill_isa(dtype)} paged kernel" if self.prefill_kernel is not None else "gather + SDPA"
            self.plan.append(f"attention: decode {decode}; prefill {prefill}")

    def _prepare_step_plan(self, model: DecoderForCausalLM, cfg: ModelConfig, dtype: torch.dtype) -> None:
        k = self.kernels
        reason = k.missing.get("fused_ops", "not loaded") if k.fused_ops is None else \
            fused_ops_support(dtype, cfg.head_dim)
        if reason is not None:
            self.step_plan = None
            self.fell_back("fused ops", reason)
            self.fell_back("decode layers op", "needs the fused ops")
            return
        decode = None
        reason = self._decode_layers_reason(model, cfg, dtype)
        if reason is None:
            decode = DecodeLayers(model.model, k.decode_layers, self.limits)
            rows = "every batch size" if decode.max_rows >= GEMV_ROWS_WITHOUT_DENSE_BF16 else f"1-{decode.max_rows} rows"
            self.plan.append(f"decode steps of {rows}: every layer in one C++ call")
        else:
            self.fell_back("decode layers op", reason)
        self.step_plan = StepPlan(build_plan(model.model), k.fused_ops, decode)
        self.plan.append("elementwise: fused norms, q/k norm + rotary, SiLU-multiply")

    def _decode_layers_reason(self, model: DecoderForCausalLM, cfg: ModelConfig, dtype: torch.dtype) -> str | None:
        if self.kernels.decode_layers is None:
            return self.kernels.missing.get("decode_layers", "not loaded")
        if self.decode_kernel is None:
            return "needs the decode attention kernel"
        return decode_supports(dtype, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                               cfg.head_dim, cfg.intermediate_size) or DecodeLayers.supports(model.model)

    # -- running it -------------------------------------------------------------------------------
    def default_block_size(self, fmt: KVFormat | None) -> int:
        """32 tokens for the 8-bit caches, 16 otherwise. The decode attention kernels read a block's K
        (and V) rows as one run, and on a CPU a run of 16 KB (16 tokens of Qwen3-0.6B's 8-bit rows)
        streams from memory slower than one of 32 KB once blocks are scattered over the pool: int8 K/V
        read 1.10-1.28x faster in blocks of 32 at 2,048-32,768 tokens on shuffled blocks, and alike on
        ascending ones (BENCHMARKS.md). vLLM's CPU backend defaults to 128 for every cache. Prefix
        reuse is exact to the token whatever the size (the block a match ends inside is copied)."""
        base = super().default_block_size(fmt)
        return base if fmt is None else 2 * base

    def allocate_kv_cache(
        self, model: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, fmt: KVFormat | None = None
    ) -> KVCache:
        # decode attention streams the pools: huge pages, zero-filled as mapped (pages are faulted
        # in as blocks are first used)
        return KVCache(model, num_blocks, block_size, dtype, "cpu", allocate=huge_page_tensors, fmt=fmt)

    def attention(self, kv_cache: KVCache) -> PagedAttention:
        return PagedAttention(kv_cache, self.decode_kernel, self.prefill_kernel)

    def greedy_pick(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        ops = self.kernels.fused_ops
        if ops is None or logits.dtype != torch.float32:
            return None
        return ops.greedy_pick(logits)

    @property
    def draws_tokens(self) -> bool:
        return self.kernels.token_draw is not None

    def draw_tokens(
        self, logits: torch.Tensor, temperature: torch.Tensor, log_min_p: torch.Tensor, uniform: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        op = self.kernels.token_draw
        if op is None or logits.dtype != torch.float32:
            return None
        return op(logits, temperature, log_min_p, uniform)

    def warm_up(self, model: DecoderForCausalLM, max_rows: int, head_rows: int) -> str | None:
        t0 = time.perf_counter()
        runs = warm_row_buckets(model, max_rows, head_rows, model.model.embed_tokens.weight.dtype)
        return f"warm-up: {runs} matmuls over every row bucket in {time.perf_counter() - t0:.2f}s (oneDNN primitives)"

    def forward(
        self, model: DecoderForCausalLM, input_ids: torch.Tensor, positions: torch.Tensor, attention: Attention
    ) -> torch.Tensor:
        if self.step_plan is None:
            return model(input_ids, positions, attention)
        return fused_forward(model.model, self.step_plan, input_ids, positions, attention)


def _grouped(left: list[str]) -> dict[str, str]:
    """``["model.layers.0.mlp.down_proj: why", ...]`` -> {why: "model.layers.*.mlp.down_proj (3)"}."""
    by_reason: dict[str, dict[str, int]] = defaultdict(dict)
    for entry in left:
        name, _, reason = entry.partition(": ")
        pattern = re.sub(r"\.\d+\.", ".*.", name)
        by_reason[reason][pattern] = by_reason[reason].get(pattern, 0) + 1
    return {reason: ", ".join(f"{p} ({n})" if n > 1 else p for p, n in names.items())
            for reason, names in by_reason.items()}
