"""The CPU backend's compiled kernels, loaded once: each one present, or absent with the reason.

``CpuKernels.load(disable)`` builds (or loads from the disk cache) every kernel this CPU can run;
``disable`` names kernels to leave out on purpose (``EngineConfig.cpu_disable_kernels``: a test
or an A/B comparison, never a patch of module state). Tests may also build a ``CpuKernels`` by
hand, e.g. with a wrapped op, and hand it to ``CpuBackend``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from swiftlm.backends.cpu.kernels.amx_linear_cpu import AmxKernel, load_amx_kernel
from swiftlm.backends.cpu.kernels.attention_cpu import PagedDecodeAttention, load_paged_attention
from swiftlm.backends.cpu.kernels.bf16_linear_cpu import load_bf16_gemv
from swiftlm.backends.cpu.kernels.decode_cpu import load_decode_layers
from swiftlm.backends.cpu.kernels.fused_cpu import FusedOps, load_fused_ops
from swiftlm.backends.cpu.kernels.gemm_cpu import BF16Gemm, load_bf16_gemm
from swiftlm.backends.cpu.kernels.prefill_attention_cpu import PagedPrefillAttention, load_prefill_attention
from swiftlm.backends.cpu.kernels.quant_cpu import load_quant_kernels
from swiftlm.backends.cpu.kernels.token_draw_cpu import DrawTokens, load_token_draw
from swiftlm.backends.quant_ops import QuantOps
from swiftlm.platform import cpu_flags

Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KERNELS = ("fused_ops", "gemv", "gemm", "amx", "attention", "prefill_attention", "decode_layers", "quant", "token_draw")


@dataclass(frozen=True, slots=True)
class CpuKernels:
    fused_ops: FusedOps | None = None  # norms, q/k norm + rotary, SiLU-multiply (kernels/fused_cpu.cpp)
    gemv: Linear | None = None  # bf16 GEMV, AVX512-BF16 or AVX2 (kernels/bf16_linear_cpu.cpp)
    gemm: BF16Gemm | None = None  # bf16 GEMM for prefill rows, AVX-512 without AMX (kernels/bf16_gemm.h)
    amx: AmxKernel | None = None  # bf16 linear for small batches, AMX, and its row capacity
    attention: PagedDecodeAttention | None = None  # paged decode attention, AVX-512 or AVX2
    prefill_attention: PagedPrefillAttention | None = None  # paged prefill (flash) attention, AVX-512 or AVX2
    decode_layers: Callable[..., torch.Tensor] | None = None  # every layer of a decode step in C++
    quant: QuantOps | None = None  # int8 / int4 GEMVs, AVX512-VNNI
    token_draw: DrawTokens | None = None  # a step's tokens from its logits (kernels/token_draw_cpu.cpp)
    missing: dict[str, str] = field(default_factory=dict)  # kernel -> why it is not here

    def __deepcopy__(self, memo: dict) -> CpuKernels:
        return self  # stateless ops; models holding them can be deep-copied

    @classmethod
    def none(cls, reason: str = "kernels off") -> CpuKernels:
        return cls(missing=dict.fromkeys(KERNELS, reason))

    @classmethod
    def load(cls, disable: Iterable[str] = ()) -> CpuKernels:
        disable = set(disable)
        unknown = disable - set(KERNELS)
        if unknown:
            raise ValueError(f"unknown CPU kernels {', '.join(sorted(unknown))}; known: {', '.join(KERNELS)}")
        flags = ", ".join(sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx")))) or "no AVX-512"
        missing: dict[str, str] = {}

        def take(name: str, loader: Callable[[], object]) -> object:
            if name in disable:
                missing[name] = "disabled by configuration"
                return None
            op = loader()
            if op is None:
                missing[name] = f"not loaded: this CPU lacks its instruction set, or its build failed (logged) ({flags})"
            return op

        fused = take("fused_ops", load_fused_ops)
        gemv = take("gemv", load_bf16_gemv)
        amx = take("amx", load_amx_kernel)
        # with AMX oneDNN's matmul runs on its tiles, faster than any AVX-512 GEMM: not a fallback, so not
        # listed as missing
        gemm = take("gemm", load_bf16_gemm) if amx is None else None
        attention = take("attention", load_paged_attention)
        prefill = take("prefill_attention", load_prefill_attention)
        decode = take("decode_layers", load_decode_layers)
        quant = take("quant", load_quant_kernels)
        token_draw = take("token_draw", load_token_draw)
        return cls(fused_ops=fused, gemv=gemv, gemm=gemm, amx=amx,
                   attention=attention, prefill_attention=prefill, decode_layers=decode, quant=quant,
                   token_draw=token_draw, missing=missing)
