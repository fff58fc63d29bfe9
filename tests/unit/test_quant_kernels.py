"""The int8 / int4 VNNI kernels against their plain torch twins, and the weight formats."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from swiftlm.backends.cpu.kernels.quant_cpu import load_quant_kernels
from swiftlm.backends.cpu.limits import QUANT_GEMV_ROWS
from swiftlm.backends.quant import QuantLinear, quantize_weight_int4, quantize_weight_int8
from swiftlm.backends.quant_ops import TORCH_OPS, QuantOps, dequantize_activations
from swiftlm.platform import cpu_flags

HAS_VNNI = "avx512_vnni" in cpu_flags()
DTYPES = (torch.float32, torch.bfloat16)


@pytest.fixture(scope="module")
def kernels() -> QuantOps:
    ops = load_quant_kernels()
    if ops is None:
        pytest.skip("quantised kernels unavailable on this CPU")
    return ops


def test_kernels_load_where_the_cpu_has_vnni() -> None:
    if not HAS_VNNI:
        pytest.skip("CPU without AVX512-VNNI")
    assert load_quant_kernels() is not None, "avx512_vnni is present but the kernels did not build or load"


def test_loader_falls_back_to_none(caplog: pytest.LogCaptureFixture) -> None:
    """The loading every kernel uses: a CPU without the instruction set, or a failed build, is a
    fallback (False, the reason logged), not an error."""
    from swiftlm.backends.cpu.kernels import quant_cpu
    from swiftlm.backends.cpu.kernels.build import try_load_cpu_op_library

    def load(**machine: object) -> bool:
        return try_load_cpu_op_library("swiftlm_quant", quant_cpu.SOURCE, "quantised linear kernels",
                                       quant_cpu.REQUIRED_CPU_FLAGS, **machine)

    with caplog.at_level("INFO"):
        assert not load(available_flags=frozenset({"avx512f", "avx512bw"}))
    assert "CPU lacks avx512vl, avx512_vnni" in caplog.text

    def broken_build(*args: object) -> None:
        raise RuntimeError("Error building extension 'swiftlm_quant'")

    assert not load(available_flags=frozenset(quant_cpu.REQUIRED_CPU_FLAGS), build=broken_build)
    assert "Error building extension" in caplog.text


def quantized(method: str, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return quantize_weight_int8(w) if method == "int8" else quantize_weight_int4(w, 64 if w.shape[1] % 64 == 0 else 32)


def gemv(ops: QuantOps, method: str, x: torch.Tensor, q: tuple[torch.Tensor, ...], n: int) -> torch.Tensor:
    return (ops.int8_gemv if method == "int8" else ops.int4_gemv)(x, *q, n)


def random_activations(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    x[:, 7] *= 30  # an outlier channel, as real activations have
    if m > 1:
        x[1, 32:64] = 0  # an all-zero block
    return x.to(dtype)


def assert_matches_reference(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """ref: the float64 oracle rounded to float32. Kernels accumulate in float32 (1e-7 relative per
    step); bfloat16 outputs may round the other way from a value next to a midpoint (one bf16 ulp)."""
    assert got.dtype == dtype
    err = (got.float() - ref).abs()
    bound = 2e-6 * ref.abs().amax(dim=1, keepdim=True)
    if dtype == torch.bfloat16:
        bound = bound + ref.abs() * 2.0**-8
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"error {worst:.2f}x the bound"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("m", [1, 3, 15, 16, 17, 64, 81])
@pytest.mark.parametrize("k, n", [(1024, 1024), (1024, 3072), (3072, 1024), (96, 40)])
def test_gemv_matches_torch_reference(kernels: QuantOps, method: str, dtype: torch.dtype, m: int, k: int, n: int) -> None:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(k + n)) * 0.05
    q = quantized(method, w)
    x = random_activations(m, k, dtype, seed=m)
    ref = gemv(TORCH_OPS, method, x.float(), q, n)  # float64 math, rounded to float32
    assert_matches_reference(gemv(kernels, method, x, q, n), ref, dtype)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_gemv_lm_head_shape(kernels: QuantOps, method: str) -> None:
    """The tied lm_head's 151936 channels, with random codes and scales; checked on three slices."""
    n, k = 151936, 1024
    g = torch.Generator().manual_seed(0)
    tiles = n // 16
    if method == "int8":
        q: tuple[torch.Tensor, ...] = (
            torch.randint(1, 256, (tiles, k // 4, 64), generator=g, dtype=torch.uint8),
            torch.rand(n, generator=g) * 1e-3,
        )
    else:
        q = (
            torch.randint(0, 256, (tiles, k // 32, 4, 64), generator=g, dtype=torch.uint8),
            (torch.rand(tiles, k // 64, 16, generator=g) * 1e-2).half(),
            (torch.rand(tiles, k // 64, 16, generator=g) * -0.1).half(),
        )
    x = random_activations(2, k, torch.bfloat16, seed=5)
    got = gemv(kernels, method, x, q, n)
    deq = TORCH_OPS.int8_dequantize if method == "int8" else TORCH_OPS.int4_dequantize
    xa = dequantize_activations(x, torch.float64)
    for n0, n1 in [(0, 2048), (75008, 77056), (n - 2048, n)]:
        ref = (xa @ deq(*q, n0, n1, torch.float64).T).float()
        assert_matches_reference(got[:, n0:n1], ref, torch.bfloat16)


def exact_activations(m: int, k: int, seed: int) -> torch.Tensor:
    """Integers / 8 with 127 in every block: block scales are exactly 1/8 and quantisation is exact."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-127, 128, (m, k), generator=g).float()
    a[:, ::32] = 127
    return a / 8


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_integer_dot_products_are_exact(kernels: QuantOps, method: str, dtype: torch.dtype) -> None:
    """With power-of-two scales every float step is exact too, so kernel and oracle agree bit for bit."""
    n, k = 48, 3072
    g = torch.Generator().manual_seed(1)
    if method == "int8":
        codes = torch.randint(-8, 9, (n, k), generator=g)
        codes[:, 0] = 127
        qweight, scales = quantize_weight_int8(codes / 128)
        assert torch.allclose(scales, torch.full_like(scales, 1 / 128))
        q: tuple[torch.Tensor, ...] = (qweight, torch.full_like(scales, 1 / 128))
    else:
        codes = torch.randint(0, 16, (n, k), generator=g)
        codes[:, ::64] = 0
        codes[:, 1::64] = 15
        q = quantize_weight_int4((codes - 8) / 16, 64)
        assert bool((q[1] == 1 / 16).all()) and bool((q[2] == -0.5).all())
    x = exact_activations(5, k, seed=2).to(dtype)
    assert torch.equal(gemv(kernels, method, x, q, n), gemv(TORCH_OPS, method, x, q, n))


@pytest.mark.parametrize("dtype", DTYPES)
def test_activation_quantisation_is_bit_exact(kernels: QuantOps, dtype: torch.dtype) -> None:
    x = random_activations(7, 3072, dtype, seed=3)
    x[2, :96] = torch.tensor([1.0, 0.5, -0.5, 0.25] * 24)  # halfway cases: 63.5 rounds to even
    for got, want in zip(kernels.quantize_activations(x), TORCH_OPS.quantize_activations(x), strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert torch.equal(kernels.fake_quantize_activations(x), TORCH_OPS.fake_quantize_activations(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_dequantize_matches_torch(kernels: QuantOps, method: str, dtype: torch.dtype) -> None:
    n, k = 100, 192  # a partial last tile; int4 groups of 64
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(4))
    q = quantized(method, w)
    deq = kernels.int8_dequantize if method == "int8" else kernels.int4_dequantize
    ref_deq = TORCH_OPS.int8_dequantize if method == "int8" else TORCH_OPS.int4_dequantize
    for n0, n1 in [(0, n), (16, 50), (96, 100)]:
        got = deq(*q, n0, n1, dtype)
        ref = ref_deq(*q, n0, n1, torch.float64)
        assert got.shape == (n1 - n0, k) and got.dtype == dtype
        assert torch.equal(got, ref.float().to(dtype)), f"channels {n0}..{n1}"  # one float32 rounding


def test_kernels_reject_bad_inputs(kernels: QuantOps) -> None:
    qweight, scales = quantize_weight_int8(torch.randn(32, 64))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        kernels.int8_gemv(torch.randn(1, 64, dtype=torch.float64), qweight, scales, 32)
    with pytest.raises(RuntimeError, match="K = 128"):
        kernels.int8_gemv(torch.randn(1, 128), qweight, scales, 32)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        kernels.int8_dequantize(qweight, scales, 8, 32, torch.float32)


def test_int8_round_trip_error_is_half_a_step() -> None:
    w = torch.randn(300, 256, generator=torch.Generator().manual_seed(5))
    w[3] = 0  # an all-zero channel
    qweight, scales = quantize_weight_int8(w)
    deq = TORCH_OPS.int8_dequantize(qweight, scales, 0, 300, torch.float64)
    step = (w.abs().amax(1, keepdim=True) / 127).double()
    assert bool(((deq - w.double()).abs() <= step * (0.5 + 1e-6)).all())
    assert bool((deq[3] == 0).all())
    rel = (deq - w.double()).norm() / w.double().norm()
    assert rel < 0.01


@pytest.mark.parametrize("group", [32, 64])
def test_int4_round_trip_error_is_half_a_step(group: int) -> None:
    w = torch.randn(300, 256, generator=torch.Generator().manual_seed(6))
    w[5, :group] = 0.25  # a constant group
    qweight, scales, mins = quantize_weight_int4(w, group)
    deq = TORCH_OPS.int4_dequantize(qweight, scales, mins, 0, 300, torch.float64)
    wg = w.double().view(300, -1, group)
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    step = (hi - lo) / 15
    bound = 0.5 * step + 2.0**-10 * torch.maximum(lo.abs(), hi.abs())  # float16 scale and minimum
    assert bool(((deq.view_as(wg) - wg).abs() <= bound).all())
    assert deq[5, :group].sub(0.25).abs().max() < 1e-3
    rel = (deq - w.double()).norm() / w.double().norm()
    assert rel < (0.09 if group == 32 else 0.1)  # uniform error of a 15-step grid over ~4.5 sigma


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_quant_linear_paths_agree(method: str, dtype: torch.dtype) -> None:
    """GEMV (M <= 64), dense (M > 64) and torch fallback compute one function; 3-D input and bias."""
    torch.manual_seed(7)
    linear = nn.Linear(128, 80, bias=True)
    fast = QuantLinear.from_linear(linear, method, load_quant_kernels(), QUANT_GEMV_ROWS)
    plain = QuantLinear.from_linear(linear, method, None)
    ref = QuantLinear.from_linear(linear, method, None)
    ref.use_reference()
    x = torch.randn(2, 40, 128).to(dtype)
    want = ref(x.float())
    for rows in (1, 16, 64, 80):
        xs = x.reshape(80, 128)[:rows]
        for layer in (fast, plain):
            got = layer(xs)
            assert got.shape == (rows, 80) and got.dtype == dtype
            tol = 2e-5 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(got.float(), want.reshape(80, 80)[:rows], rtol=tol, atol=tol)
    assert fast(x).shape == (2, 40, 80)
    assert {name for name, _ in fast.named_buffers()} == (
        {"qweight", "scales", "bias"} | ({"mins"} if method == "int4" else set())
    )


def test_dense_path_slices_large_layers() -> None:
    torch.manual_seed(8)
    linear = nn.Linear(64, 1000, bias=False)
    layer = QuantLinear.from_linear(linear, "int4", load_quant_kernels(), QUANT_GEMV_ROWS)
    x = torch.randn(80, 64)  # more rows than QUANT_GEMV_ROWS: the dense path
    whole = layer(x)
    layer.DENSE_SLICE = 64 * 48  # 48 channels per slice: 21 slices, the last one partial
    sliced = layer(x)
    assert sliced.shape == (80, 1000)
    torch.testing.assert_close(sliced, whole, rtol=1e-6, atol=1e-6)

