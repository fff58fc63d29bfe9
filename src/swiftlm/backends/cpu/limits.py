"""How many rows each CPU linear kernel takes: the one place these limits are decided.

``GemvLinear``, ``QuantLinear`` and the decode layers op (in C++) read them from here; the AMX
kernel's capacity comes from the kernel itself (``kernels/amx_linear.h``, read through
``amx_linear_cpu.amx_capacity()``), so a change of it touches that header alone.

Measurements behind the numbers (2-core AMX Xeon VM, the 112 layer linears of the Qwen3-0.6B
shape, bf16, 2 threads): GEMV kernel vs F.linear at 1 row 40 vs 71 ms, 4 rows 52 vs 71, 6 rows
59 vs 72, 8 rows 68 vs 70, 12 rows 87 vs 72: the GEMV takes up to 6 rows. With AMX, 2+ rows are
faster through it (2 rows 60 vs 75 ms, 4 rows 64 vs 83), so the GEMV keeps 1 row. Quantised
layers, bf16 1024 -> 3072 on one core: M = 32: GEMV 0.56 ms vs dequantise + dense 1.24 ms; 64:
1.03 vs 1.48; 128: 2.03 vs 1.83: the quantised GEMV takes up to 64 rows there. Without AMX it takes
every row count: on a 2-core Zen4 VM (2 threads, Qwen3-0.6B's q/k/v, gate/up and down) the int8 GEMV
ran at 634-719 GOP/s at 16, 64 and 512 rows and the int4 one at 560-626, where dequantise + F.linear ran
at 45-400 and bf16 F.linear itself at 261-435: quantised prompts prefill faster than bf16 ones.

Without AMX the bf16 GEMM (``kernels/bf16_gemm.h``) takes the rows above the GEMV's, in place of
oneDNN: on the Zen4 VM 290-349 GFLOP/s at 8 rows (F.linear 201-224), 398-415 at 32-64 (F.linear
275-390), 395-428 at 128-512 (F.linear 373-444), of a vdpbf16ps peak of 468 (``flops.c``).

Where oneDNN has no bf16 path (AVX2 CPUs without AVX-512: torch's bf16 matmul runs at ~12 GFLOP/s
on a 2-core Zen3 VM), the bf16 kernel takes every row count, prefill chunks included: the GEMV up to
15 rows (6144 x 1024 at 8 rows 2.0 vs 8.8 ms for F.linear), a float32 GEMM from 16 (bf16_gemv.h:
144-182 GFLOP/s at 64-512 rows with AVX2 code on a Zen4 VM, where the GEMV's passes of 64 rows ran
at ~80 and oneDNN's float32 matmul at ~150).
"""

from __future__ import annotations

from dataclasses import dataclass

GEMV_ROWS_WITHOUT_AMX = 6
GEMV_ROWS_WITHOUT_DENSE_BF16 = 1 << 20  # every row count a step can hold
QUANT_GEMV_ROWS = 64  # with AMX: oneDNN's AMX matmul on the dequantised weights is faster above
QUANT_GEMV_ROWS_WITHOUT_AMX = GEMV_ROWS_WITHOUT_DENSE_BF16  # every row count


@dataclass(frozen=True, slots=True)
class RowLimits:
    """Rows a linear sends through each kernel; more rows go to a dense matmul."""

    gemv: int  # bf16 GEMV kernel: 1 .. gemv rows; 0 when it is not in use
    amx: int  # AMX kernel: gemv + 1 .. amx rows; 0 when it is not in use
    quant_gemv: int  # int8 / int4 VNNI GEMV kernels: 1 .. quant_gemv rows; 0 when not in use
    gemm: bool = False  # bf16 GEMM kernel: every row count above the GEMV's (and AMX's), instead of oneDNN

    def __post_init__(self) -> None:
        if min(self.gemv, self.amx, self.quant_gemv) < 0 or (self.amx and self.amx <= self.gemv):
            raise ValueError(f"inconsistent row limits {self}")
        if self.gemm and not self.gemv:
            raise ValueError(f"inconsistent row limits {self}: the bf16 GEMM sits beside the GEMV")

    @classmethod
    def for_kernels(
        cls, gemv: bool, amx_capacity: int | None, quant: bool, dense_bf16: bool = True, gemm: bool = False
    ) -> RowLimits:
        """The limits for the kernels that loaded (``amx_capacity``: None without AMX; ``dense_bf16``:
        whether oneDNN has a bf16 path for the dense matmul on this CPU; ``gemm``: swiftlm's bf16 GEMM,
        which takes the rows above the GEMV's where there is no AMX)."""
        amx = amx_capacity or 0
        rows = 1 if amx else GEMV_ROWS_WITHOUT_AMX if dense_bf16 else GEMV_ROWS_WITHOUT_DENSE_BF16
        quant_rows = QUANT_GEMV_ROWS if amx else QUANT_GEMV_ROWS_WITHOUT_AMX
        return cls(gemv=rows if gemv else 0, amx=amx if gemv else 0, quant_gemv=quant_rows if quant else 0,
                   gemm=gemm and gemv and not amx and rows < GEMV_ROWS_WITHOUT_DENSE_BF16)

    @property
    def gemv_takes_every_row(self) -> bool:
        """Whether the bf16 GEMV takes every row count (CPUs whose dense bf16 matmul is slow)."""
        return self.gemv >= GEMV_ROWS_WITHOUT_DENSE_BF16

    @property
    def bf16_kernel_rows(self) -> int:
        """Rows a bf16 linear takes through swiftlm's kernels (GEMV, then AMX)."""
        return max(self.gemv, self.amx)

    def describe_bf16(self) -> str:
        """The bf16 kernels' rows in words, e.g. "bf16 GEMV 1 row, AMX 2-32 rows"."""
        parts = []
        if self.gemv:
            rows = "every row count" if self.gemv_takes_every_row else \
                f"1-{self.gemv} rows" if self.gemv > 1 else "1 row"
            parts.append(f"bf16 GEMV {rows}")
        if self.amx:
            parts.append(f"AMX {self.gemv + 1}-{self.amx} rows")
        if self.gemm:
            parts.append(f"bf16 GEMM {self.bf16_kernel_rows + 1}+ rows")
        return ", ".join(parts) or "no bf16 kernels"
