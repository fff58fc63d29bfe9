"""The paged prefill attention kernel (bf16 on AVX512-BF16's vdpbf16ps; float32 arithmetic for float32,
and for bf16 elsewhere; the native build and, on AVX-512 CPUs, the AVX2 one) against causal attention
in float64 over the gathered context, and against the torch path it replaces (gather, dequantise, SDPA
in the model's dtype)."""

from __future__ import annotations

import pytest
import torch

from swiftlm.backends.attention import causal_attention
from swiftlm.backends.cpu.kernels.prefill_attention_cpu import (
    REQUIRED_CPU_FLAGS,
    load_build_variant,
    load_prefill_attention,
    supports,
)
from swiftlm.backends.kv_quant import dequantize_kv, kv_format, quantize_kv
from tests.helpers.cpu_kernels import build_or_skip


@pytest.fixture(scope="module", params=["native", "avx2"])
def op(request: pytest.FixtureRequest):
    """The build for this CPU (bf16 on vdpbf16ps where it has AVX512-BF16), and on AVX-512 CPUs the AVX2
    code built apart (float32 arithmetic for both dtypes)."""
    return build_or_skip(request.param, load_prefill_attention, load_build_variant, "swiftlm_prefill_attention_avx2",
                         REQUIRED_CPU_FLAGS, "prefill attention kernel")


def make_case(t, seq_len, hq, hkv, d, block_size, kv="plain", seed=0, spare_blocks=5, dtype=torch.bfloat16):
    """q [t, hq, d] of ``dtype``; pools with shuffled block ids (of ``dtype``, or 8-bit with scale pools);
    the table; and the context as the torch path reads it ([seq_len, hkv, d], dequantised to ``dtype``)."""
    g = torch.Generator().manual_seed(seed)
    n_blocks = (seq_len + block_size - 1) // block_size
    num_blocks = n_blocks + spare_blocks
    k = torch.randn(num_blocks * block_size, hkv, d, generator=g)
    v = torch.randn(num_blocks * block_size, hkv, d, generator=g)
    q = torch.randn(t, hq, d, generator=g).to(dtype)
    table = torch.randperm(num_blocks, generator=g)[:n_blocks]
    shape = (num_blocks, block_size, hkv, d)
    if kv == "plain":
        k_pool, v_pool, k_scale, v_scale = k.to(dtype).view(shape), v.to(dtype).view(shape), None, None
        k_ctx, v_ctx = k_pool, v_pool
    else:
        fmt = kv_format(kv)
        (kq, ks), (vq, vs) = quantize_kv(k, fmt), quantize_kv(v, fmt)
        k_pool, v_pool = kq.view(shape), vq.view(shape)
        k_scale, v_scale = ks.view(shape[:3]), vs.view(shape[:3])
        k_ctx = dequantize_kv(kq, ks, dtype).view(shape)
        v_ctx = dequantize_kv(vq, vs, dtype).view(shape)
    k_ctx = k_ctx[table].reshape(-1, hkv, d)[:seq_len]
    v_ctx = v_ctx[table].reshape(-1, hkv, d)[:seq_len]
    return q, (k_pool, v_pool, table, seq_len, d**-0.5, k_scale, v_scale), (k_ctx, v_ctx)


def errors(op, t, seq_len, hq, hkv, d, block_size, kv="plain", seed=0, dtype=torch.bfloat16):
    """(kernel's max error, the torch path's max error in ``dtype``) against float64 causal attention."""
    q, args, (k_ctx, v_ctx) = make_case(t, seq_len, hq, hkv, d, block_size, kv, seed, dtype=dtype)
    out = op(q, *args)
    assert out.dtype == dtype and out.shape == q.shape
    exact = causal_attention(q.double(), k_ctx.double(), v_ctx.double())
    torch_path = causal_attention(q, k_ctx, v_ctx)
    return (out.double() - exact).abs().max().item(), (torch_path.double() - exact).abs().max().item()


CASES = [  # t, seq_len, hq, hkv, d, block_size
    (1, 1, 2, 1, 64, 16),        # one token, one key
    (5, 5, 4, 2, 64, 16),        # a whole short prompt
    (17, 40, 16, 8, 128, 16),    # a chunk after a prefix, Qwen3-0.6B's heads
    (33, 100, 6, 2, 128, 32),    # GQA 3
    (70, 70, 3, 3, 256, 16),     # no GQA, head_dim 256
    (40, 300, 12, 2, 64, 8),     # GQA 6, small blocks, several softmax steps
    (100, 130, 24, 3, 128, 16),  # GQA 8: 4 positions a task
    (64, 64, 32, 1, 64, 16),     # GQA 32: one position a task
    (129, 1000, 16, 8, 128, 16),  # past the 64-key steps and 32-row tasks on both ends
]


@pytest.mark.parametrize(("t", "seq_len", "hq", "hkv", "d", "block_size"), CASES)
def test_matches_causal_attention(op, t, seq_len, hq, hkv, d, block_size) -> None:
    err, err_torch = errors(op, t, seq_len, hq, hkv, d, block_size)
    # the output's own bf16 rounding dominates both; the kernel's bf16 weights add little to it
    assert err <= max(1.5 * err_torch, 4e-3), (err, err_torch)


@pytest.mark.parametrize("kv", ["int8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize(("t", "seq_len", "hq", "hkv", "d", "block_size"),
                         [(64, 200, 16, 8, 128, 32), (50, 77, 4, 1, 64, 16), (9, 9, 6, 2, 256, 8)])
def test_eight_bit_pools_match_the_dequantised_context(op, kv, t, seq_len, hq, hkv, d, block_size) -> None:
    err, err_torch = errors(op, t, seq_len, hq, hkv, d, block_size, kv)
    assert err <= max(1.5 * err_torch, 4e-3), (err, err_torch)


def test_sharp_softmax_rescales_across_steps(op) -> None:
    """Scores of tens (q scaled up): each 64-key step raises some rows' maxima, the accumulators rescale."""
    q, args, (k_ctx, v_ctx) = make_case(48, 500, 16, 8, 128, 16, seed=3)
    q = (q.float() * 6).bfloat16()
    out = op(q, *args)
    exact = causal_attention(q.double(), k_ctx.double(), v_ctx.double())
    err = (out.double() - exact).abs().max().item()
    err_torch = (causal_attention(q, k_ctx, v_ctx).double() - exact).abs().max().item()
    assert err <= max(1.5 * err_torch, 1e-2), (err, err_torch)


def test_deterministic_and_rows_independent_of_the_chunk(op) -> None:
    """Two calls give the same bits; a chunk's rows equal the same rows computed as a longer chunk's tail
    (each row's keys and their order do not depend on the other rows)."""
    q, args, _ = make_case(96, 400, 16, 8, 128, 16, seed=5)
    a, b = op(q, *args), op(q, *args)
    assert torch.equal(a, b)
    tail = op(q[-40:], *args)
    assert torch.equal(tail, a[-40:])


def test_strided_pools_match_contiguous_ones(op) -> None:
    """Pools that are views (a larger head dimension sliced) read like contiguous ones."""
    q, (k_pool, v_pool, table, seq_len, scale, _, _), _ = make_case(20, 90, 8, 4, 64, 16, seed=7)
    wide = torch.zeros(k_pool.shape[0], k_pool.shape[1], 6, 64, dtype=torch.bfloat16)
    wide_v = wide.clone()
    wide[:, :, 1:5] = k_pool
    wide_v[:, :, 1:5] = v_pool
    strided = op(q, wide[:, :, 1:5], wide_v[:, :, 1:5], table, seq_len, scale)
    assert torch.equal(strided, op(q, k_pool, v_pool, table, seq_len, scale))


def test_rejects_bad_inputs(op) -> None:
    q, (k_pool, v_pool, table, seq_len, scale, _, _), _ = make_case(8, 40, 4, 2, 64, 16)
    with pytest.raises(RuntimeError, match="outside the pool"):
        op(q, k_pool, v_pool, torch.tensor([0, 1, k_pool.shape[0]]), seq_len, scale)
    with pytest.raises(RuntimeError, match="does not fit"):
        op(q, k_pool, v_pool, table[:2], seq_len, scale)
    with pytest.raises(RuntimeError, match="shorter than the chunk"):
        op(q, k_pool, v_pool, table, 4, scale)
    with pytest.raises(RuntimeError, match="q's dtype"):
        op(q.float(), k_pool, v_pool, table, seq_len, scale)
    with pytest.raises(RuntimeError, match="bfloat16 or float32"):
        op(q.half(), k_pool.half(), v_pool.half(), table, seq_len, scale)
    with pytest.raises(RuntimeError, match="head_dim"):
        op(q[..., :48].contiguous(), k_pool[..., :48], v_pool[..., :48], table, seq_len, scale)
    with pytest.raises(RuntimeError, match="need k_scales"):
        op(q, k_pool.view(torch.int8)[..., :64], v_pool.view(torch.int8)[..., :64], table, seq_len, scale)


# float32 tests: both builds' errors are float32 rounding in another order of the sums than torch's
# (~1e-6 here); a wrong mask, scale or key order is off by 1e-2 or more
F32_CASES = [CASES[i] for i in (0, 1, 2, 3, 4, 5, 7, 8)]


@pytest.mark.parametrize(("t", "seq_len", "hq", "hkv", "d", "block_size"), F32_CASES)
def test_float32_matches_causal_attention(op, t, seq_len, hq, hkv, d, block_size) -> None:
    err, err_torch = errors(op, t, seq_len, hq, hkv, d, block_size, dtype=torch.float32)
    assert err <= max(3 * err_torch, 2e-6), (err, err_torch)


@pytest.mark.parametrize("kv", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_float32_on_eight_bit_pools_matches_the_dequantised_context(op, kv) -> None:
    for case in [(64, 200, 16, 8, 128, 32), (9, 9, 6, 2, 256, 8)]:
        err, err_torch = errors(op, *case, kv, dtype=torch.float32)
        assert err <= max(3 * err_torch, 2e-6), (case, err, err_torch)


def test_float32_sharp_softmax_deterministic_and_strided(op) -> None:
    """Scores of tens rescale across steps; two calls give the same bits; a chunk's tail rows equal a
    shorter chunk's; pools that are views read like contiguous ones."""
    q, args, (k_ctx, v_ctx) = make_case(96, 500, 16, 8, 128, 16, seed=3, dtype=torch.float32)
    q = q * 6
    out = op(q, *args)
    exact = causal_attention(q.double(), k_ctx.double(), v_ctx.double())
    err = (out.double() - exact).abs().max().item()
    err_torch = (causal_attention(q, k_ctx, v_ctx).double() - exact).abs().max().item()
    assert err <= max(3 * err_torch, 1e-5), (err, err_torch)
    assert torch.equal(out, op(q, *args))
    assert torch.equal(op(q[-40:], *args), out[-40:])
    k_pool, v_pool, table, seq_len, scale, _, _ = args
    wide = torch.zeros(k_pool.shape[0], k_pool.shape[1], 10, 128)
    wide_v = wide.clone()
    wide[:, :, 1:9] = k_pool
    wide_v[:, :, 1:9] = v_pool
    assert torch.equal(op(q, wide[:, :, 1:9], wide_v[:, :, 1:9], table, seq_len, scale), out)


def test_supports() -> None:
    zen4 = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16"})
    amx = zen4 | {"amx_bf16"}
    avx2 = frozenset({"avx2", "fma", "f16c"})
    assert supports(torch.bfloat16, 128, 16, 8, flags=zen4) is None
    assert supports(torch.float32, 128, 16, 8, flags=zen4) is None
    assert supports(torch.float32, 128, 16, 8, flags=amx) is None
    assert supports(torch.float32, 64, 16, 8, flags=avx2) is None
    assert supports(torch.bfloat16, 128, 16, 8, flags=avx2) is None  # float32 arithmetic
    assert "AMX" in supports(torch.bfloat16, 128, 16, 8, flags=amx)
    assert "float16" in supports(torch.float16, 128, 16, 8, flags=zen4)
    assert "head_dim" in supports(torch.float32, 80, 16, 8, flags=zen4)
    assert "multiple" in supports(torch.bfloat16, 128, 12, 8, flags=zen4)
