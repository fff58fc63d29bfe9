"""The paged decode attention kernel (AVX-512, or AVX2 on CPUs without it: whichever this CPU builds)
against the torch path (gather + SDPA with a length mask)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from swiftlm.backends.cpu.kernels.attention_cpu import REQUIRED_CPU_FLAGS, load_paged_attention
from swiftlm.platform import cpu_flags
from tests.helpers.cpu_kernels import kernel_or_skip

MIXED_LENS = [1, 15, 16, 17, 1000, 2049]


@pytest.fixture(scope="module")
def op():
    return kernel_or_skip(load_paged_attention, REQUIRED_CPU_FLAGS, "paged attention kernel")


def test_kernel_loads_on_avx2_machines() -> None:
    """A broken build must not hide behind the skip above."""
    if not all(f in cpu_flags() for f in REQUIRED_CPU_FLAGS):
        pytest.skip(f"no {REQUIRED_CPU_FLAGS} on this CPU")
    assert load_paged_attention() is not None


def oracle(q, k_pool, v_pool, block_tables, seq_lens, scale):
    """Gather each request's blocks, then SDPA with a length mask (in float64)."""
    b = q.shape[0]
    n_kv, d = k_pool.shape[2], k_pool.shape[3]
    k = k_pool.double()[block_tables].view(b, -1, n_kv, d).transpose(1, 2)  # [B, Hkv, L, D]
    v = v_pool.double()[block_tables].view(b, -1, n_kv, d).transpose(1, 2)
    keys = torch.arange(k.shape[2])
    mask = (keys.unsqueeze(0) < seq_lens.unsqueeze(1)).view(b, 1, 1, -1)
    out = F.scaled_dot_product_attention(
        q.double().unsqueeze(2), k, v, attn_mask=mask, scale=scale, enable_gqa=True
    )
    return out.squeeze(2)  # [B, Hq, D]


def make_case(seq_lens, hq, hkv, d, dtype, block_size=16, seed=0, spare_blocks=7):
    """Pools with shuffled, non-contiguous block ids; tables padded with the null block 0."""
    g = torch.Generator().manual_seed(seed)
    nblocks = [(n + block_size - 1) // block_size for n in seq_lens]
    num_blocks = 1 + sum(nblocks) + spare_blocks
    k_pool = torch.randn(num_blocks, block_size, hkv, d, generator=g).to(dtype)
    v_pool = torch.randn(num_blocks, block_size, hkv, d, generator=g).to(dtype)
    ids = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    max_blocks = max(nblocks) + 2
    tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int64)
    for i, n in enumerate(nblocks):
        tables[i, :n] = torch.tensor(ids[:n])
        ids = ids[n:]
    q = torch.randn(len(seq_lens), hq, d, generator=g).to(dtype)
    return q, k_pool, v_pool, tables, torch.tensor(seq_lens, dtype=torch.int64)


def check(op, seq_lens, hq, hkv, d, dtype, **kw):
    q, k_pool, v_pool, tables, lens = make_case(seq_lens, hq, hkv, d, dtype, **kw)
    scale = d**-0.5
    out = op(q, k_pool, v_pool, tables, lens, scale)
    assert out.dtype == dtype and out.shape == q.shape
    ref = oracle(q, k_pool, v_pool, tables, lens, scale)
    err = (out.double() - ref).abs().max().item()
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    assert err <= tol, f"max abs diff {err:.3g} > {tol} for lens={seq_lens} Hq={hq} Hkv={hkv} D={d} {dtype}"
    return out, (q, k_pool, v_pool, tables, lens, scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("hq", "hkv"), [(16, 8), (4, 2), (8, 8)])
@pytest.mark.parametrize("d", [128, 64])
def test_mixed_batch_matches_oracle(op, dtype, hq, hkv, d) -> None:
    check(op, MIXED_LENS, hq, hkv, d, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seq_len", [1, 15, 16, 17, 1000, 2049, 8200])
def test_single_request_matches_oracle(op, dtype, seq_len) -> None:
    """B=1 (long contexts are split into chunks and merged), at one and at two threads."""
    threads = torch.get_num_threads()
    try:
        for n in sorted({1, max(2, threads)}):
            torch.set_num_threads(n)
            check(op, [seq_len], 16, 8, 128, dtype, seed=seq_len)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("hq", "hkv", "d", "block_size"),
    [(28, 4, 32, 16), (32, 2, 16, 16), (12, 4, 96, 8), (6, 3, 48, 5)],
    ids=["group7-d32", "group16-d16", "bs8-d96", "bs5-d48"],
)
def test_other_shapes(op, hq, hkv, d, block_size) -> None:
    """Odd group sizes (7, and 16 > the kernel's 8), head dims with 16-wide tails, block sizes < 16."""
    for dtype in (torch.float32, torch.bfloat16):
        check(op, [3, 40, 333], hq, hkv, d, dtype, block_size=block_size)


def torch_path(q, k_pool, v_pool, block_tables, seq_lens, scale):
    """The engine's plain decode path, in the inputs' dtype: gather the blocks, SDPA with a length mask."""
    b, bs = q.shape[0], k_pool.shape[1]
    n_kv, d = k_pool.shape[2], k_pool.shape[3]
    max_blocks = int((seq_lens.max() + bs - 1) // bs)
    tables = block_tables[:, :max_blocks]
    mask = (torch.arange(max_blocks * bs).unsqueeze(0) < seq_lens.unsqueeze(1)).view(b, 1, 1, -1)
    k = k_pool[tables].view(b, -1, n_kv, d).transpose(1, 2)  # [B, Hkv, L, D]
    v = v_pool[tables].view(b, -1, n_kv, d).transpose(1, 2)
    out = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.squeeze(2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_matches_torch_path_in_its_dtype(op, dtype) -> None:
    """Same numbers as the engine's torch decode path run in bf16 / fp32 (not only the fp64 oracle)."""
    q, k_pool, v_pool, tables, seq_lens = make_case([17, 1000, 5], 16, 8, 128, dtype, seed=3)
    ref = torch_path(q, k_pool, v_pool, tables, seq_lens, 128**-0.5)
    out = op(q, k_pool, v_pool, tables, seq_lens, 128**-0.5)
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    assert (out.float() - ref.float()).abs().max().item() <= tol


def test_sharp_softmax_rescales_across_tiles(op) -> None:
    """Large scores whose running max keeps rising across tiles and chunks (online-softmax rescaling)."""
    for dtype in (torch.float32, torch.bfloat16):
        q, k_pool, v_pool, tables, lens = make_case([3000, 200], 8, 4, 64, dtype, seed=5)
        ramp = torch.linspace(0.2, 3.0, k_pool.shape[0]).view(-1, 1, 1, 1)  # later blocks: larger keys
        k_pool = (k_pool.float() * ramp).to(dtype)
        out = op(q * 4, k_pool, v_pool, tables, lens, 0.125)
        ref = oracle(q * 4, k_pool, v_pool, tables, lens, 0.125)
        tol = 2e-5 if dtype == torch.float32 else 2e-2
        assert (out.double() - ref).abs().max().item() <= tol


def test_int32_tables_strided_pools_and_empty_request(op) -> None:
    q, k_pool, v_pool, tables, lens = make_case([40, 0, 9], 16, 8, 64, torch.float32)
    # pools as views into one [2, N, bs, Hkv, D] buffer with a padded head dim: unit stride in D only
    kv = torch.zeros(2, *k_pool.shape[:3], 80)
    kv[0, ..., :64] = k_pool
    kv[1, ..., :64] = v_pool
    out = op(q, kv[0, ..., :64], kv[1, ..., :64], tables.int(), lens, 0.125)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    keep = [0, 2]
    ref = oracle(q[keep], k_pool, v_pool, tables[keep], lens[keep], 0.125)
    assert (out[keep].double() - ref).abs().max().item() <= 2e-5


def test_rejects_bad_inputs(op) -> None:
    q, k_pool, v_pool, tables, lens = make_case([20], 4, 2, 64, torch.float32)
    with pytest.raises(RuntimeError, match="outside the pool"):
        op(q, k_pool, v_pool, tables + 1000, lens, 0.125)
    with pytest.raises(RuntimeError, match="does not fit"):
        op(q, k_pool, v_pool, tables, lens + 10_000, 0.125)
    with pytest.raises(RuntimeError, match="share q.s dtype"):
        op(q, k_pool.bfloat16(), v_pool.bfloat16(), tables, lens, 0.125)


# -- 8-bit pools (the small KV cache): the kernel against the oracle on the dequantised pools --------


def quantised_case(seq_lens, hq, hkv, d, dtype, name, block_size=16, seed=0):
    """make_case's pools quantised as the engine stores them, with their scale pools."""
    from swiftlm.backends.kv_quant import kv_format, quantize_kv

    q, k_pool, v_pool, tables, lens = make_case(seq_lens, hq, hkv, d, dtype, block_size=block_size, seed=seed)
    fmt = kv_format(name)
    n, bs = k_pool.shape[:2]
    (kq, ks), (vq, vs) = (quantize_kv(p.view(-1, hkv, d), fmt) for p in (k_pool, v_pool))
    return q, kq.view(n, bs, hkv, d), vq.view(n, bs, hkv, d), ks.view(n, bs, hkv), vs.view(n, bs, hkv), tables, lens


@pytest.mark.parametrize("name", ["int8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("hq", "hkv", "d", "block_size"), [(16, 8, 128, 16), (4, 1, 64, 16), (6, 2, 48, 8),
                                                           (12, 12, 16, 16), (18, 2, 32, 16), (9, 3, 64, 32)])
def test_eight_bit_pools_match_oracle_on_dequantised_pools(op, name, dtype, hq, hkv, d, block_size) -> None:
    from swiftlm.backends.kv_quant import dequantize_kv

    q, kq, vq, ks, vs, tables, lens = quantised_case(MIXED_LENS, hq, hkv, d, dtype, name, block_size=block_size)
    out = op(q, kq, vq, tables, lens, d**-0.5, ks, vs)
    assert out.dtype == dtype and out.shape == q.shape
    ref = oracle(q, dequantize_kv(kq, ks, torch.float64), dequantize_kv(vq, vs, torch.float64), tables, lens, d**-0.5)
    err = (out.double() - ref).abs().max().item()
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    assert err <= tol, f"max abs diff {err:.3g} > {tol}: {name} Hq={hq} Hkv={hkv} D={d} bs={block_size} {dtype}"


def test_eight_bit_pools_need_their_scales(op) -> None:
    q, kq, vq, ks, vs, tables, lens = quantised_case([20], 4, 2, 64, torch.float32, "int8")
    with pytest.raises(RuntimeError, match="go with 8-bit pools"):
        op(q, kq, vq, tables, lens, 0.125)
    with pytest.raises(RuntimeError, match="go with 8-bit pools"):
        op(q, kq.float(), vq.float(), tables, lens, 0.125, ks, vs)
    with pytest.raises(RuntimeError, match="scale pools must be"):
        op(q, kq, vq, tables, lens, 0.125, ks[:, :, :1].contiguous(), vs)
    with pytest.raises(RuntimeError, match="share q's dtype, or one 8-bit dtype"):
        op(q, kq, vq.view(torch.float8_e4m3fn), tables, lens, 0.125, ks, vs)


@pytest.mark.parametrize(("hq", "hkv", "d"), [(16, 8, 128), (9, 3, 64), (18, 2, 48), (32, 4, 80)])
def test_int8_outputs_do_not_depend_on_the_block_size(op, hq, hkv, d) -> None:
    """The int8 kernels sum integers (q.k) and tile partials in token order, whatever the blocks:
    the same pools seen as blocks of 16 and as blocks of 8 (a reshape: block b of 16 is blocks 2b
    and 2b + 1 of 8) must give bit-identical outputs."""
    q, kq, vq, ks, vs, tables, lens = quantised_case(MIXED_LENS, hq, hkv, d, torch.bfloat16, "int8", seed=3)
    out16 = op(q, kq, vq, tables, lens, d**-0.5, ks, vs)
    n = kq.shape[0]
    halves = torch.stack([2 * tables, 2 * tables + 1], dim=-1).flatten(1)  # block b of 16 -> 2b, 2b + 1 of 8
    out8 = op(q, kq.view(2 * n, 8, hkv, d), vq.view(2 * n, 8, hkv, d), halves, lens, d**-0.5,
              ks.view(2 * n, 8, hkv), vs.view(2 * n, 8, hkv))
    assert torch.equal(out16, out8), f"max abs diff {(out16.float() - out8.float()).abs().max().item():.3g}"


@pytest.mark.parametrize("kv_dtype", ["int8", "bf16"])
@pytest.mark.parametrize(("d", "g"), [(128, 2), (64, 2), (64, 4), (128, 1)])
def test_q_k_row_loop_equals_the_general_loop(op, kv_dtype, d, g) -> None:
    """A lane group of 16 query heads whose kv heads are all present takes q.k in a loop specialised
    for head_dim 64 and 128 (qk_row: on int8 pools with AVX512-VNNI, and on bf16 pools with
    AVX512-BF16 and no AMX tiles); a last, part-filled group takes the general loop. Both sum the
    same products in the same order, so moving kv heads from the part-filled group into a full one
    (rolling the heads: the pools, their scales and q alike) must give bit-identical outputs per
    head. With 24 query heads and GQA group g, the first lane group holds 16 / g kv heads and the
    second the rest."""
    hq = 24
    hkv = hq // g
    full = 16 // g  # kv heads in the first (full) lane group
    if kv_dtype == "int8":
        q, k, v, ks, vs, tables, lens = quantised_case(MIXED_LENS, hq, hkv, d, torch.bfloat16, "int8", seed=7)
    else:
        q, k, v, tables, lens = make_case(MIXED_LENS, hq, hkv, d, torch.bfloat16, seed=7)
        ks = vs = None
    kv = [(j + full) % hkv for j in range(hkv)]  # new kv head j holds old head kv[j]: the part-filled group's first
    qh = [kv[h // g] * g + h % g for h in range(hq)]

    def run(q, k, v, ks, vs):
        scales = () if ks is None else (ks, vs)
        return op(q, k, v, tables, lens, d**-0.5, *scales)

    out = run(q, k, v, ks, vs)
    rolled = run(q[:, qh].contiguous(), k[:, :, kv].contiguous(), v[:, :, kv].contiguous(),
                 None if ks is None else ks[:, :, kv].contiguous(), None if vs is None else vs[:, :, kv].contiguous())
    assert torch.equal(rolled, out[:, qh]), f"max abs diff {(rolled.float() - out[:, qh].float()).abs().max().item():.3g}"


@pytest.mark.parametrize(("hq", "hkv", "d"), [(16, 8, 128), (9, 3, 64), (18, 2, 48), (32, 4, 80), (8, 8, 16)])
def test_bf16_scores_on_amx_tiles_round_only_once(op, hq, hkv, d) -> None:
    """On CPUs with AMX, bf16 pools whose blocks hold a multiple of 16 tokens take q.k on AMX tiles
    (tdpbf16ps); blocks of 8 take vdpbf16ps (or fp32 FMAs without AVX512-BF16). Both multiply the
    bf16 values exactly and sum in fp32, so the same pools seen as blocks of 16 and as blocks of 8
    must both land within half a bf16 ulp of the float64 oracle plus 1e-4. The shapes cover 64-dim
    and 16-dim chunks (head_dim 48, 80, 16), two lane groups, and GQA groups over 8."""
    q, k, v, tables, lens = make_case(MIXED_LENS, hq, hkv, d, torch.bfloat16, seed=11)
    ref = oracle(q, k, v, tables, lens, d**-0.5)
    n = k.shape[0]
    halves = torch.stack([2 * tables, 2 * tables + 1], dim=-1).flatten(1)  # block b of 16 -> 2b, 2b + 1 of 8
    for name, out in [("blocks of 16", op(q, k, v, tables, lens, d**-0.5)),
                      ("blocks of 8", op(q, k.view(2 * n, 8, hkv, d), v.view(2 * n, 8, hkv, d), halves, lens, d**-0.5))]:
        excess = ((out.double() - ref).abs() - ref.abs() * 2.0**-8).max().item()
        assert excess <= 1e-4, f"{name}: error beyond bf16 rounding {excess:.3g}: Hq={hq} Hkv={hkv} D={d}"


@pytest.mark.parametrize(("hq", "hkv", "d", "block_size"), [(16, 8, 128, 16), (8, 1, 64, 16), (5, 1, 48, 8),
                                                           (12, 12, 16, 16), (14, 2, 112, 32), (32, 4, 80, 16),
                                                           (18, 2, 48, 16), (24, 24, 32, 16)])
def test_int8_pools_with_bf16_q_round_only_once(op, hq, hkv, d, block_size) -> None:
    """bf16 q on int8 pools takes integer dot products where the CPU has AVX512-VNNI (q rounded to
    16 bits of its head's max, the softmax weights to 16 bits of their tile's max). Those roundings
    must stay far below the one rounding of the output to bf16: within half a bf16 ulp of the
    float64 oracle plus 1e-4 (8-bit weights would miss this by ~10x). The shapes cover one and
    several lane groups of 16 query heads, a last group part-filled, and GQA groups over 8 (virtual heads)."""
    from swiftlm.backends.kv_quant import dequantize_kv

    q, kq, vq, ks, vs, tables, lens = quantised_case(MIXED_LENS, hq, hkv, d, torch.bfloat16, "int8",
                                                     block_size=block_size, seed=5)
    out = op(q, kq, vq, tables, lens, d**-0.5, ks, vs)
    ref = oracle(q, dequantize_kv(kq, ks, torch.float64), dequantize_kv(vq, vs, torch.float64), tables, lens, d**-0.5)
    excess = ((out.double() - ref).abs() - ref.abs() * 2.0**-8).max().item()
    assert excess <= 1e-4, f"error beyond bf16 rounding {excess:.3g}: Hq={hq} Hkv={hkv} D={d} bs={block_size}"
    # a sharp softmax (scores 8x larger: most weights round to 0); the 16-bit q's error in a score grows
    # with the score, so the bound is 1e-3 (an 8-bit q would be off by ~5e-2)
    out = op(q * 8, kq, vq, tables, lens, d**-0.5, ks, vs)
    ref = oracle((q * 8).double(), dequantize_kv(kq, ks, torch.float64), dequantize_kv(vq, vs, torch.float64),
                 tables, lens, d**-0.5)
    excess = ((out.double() - ref).abs() - ref.abs() * 2.0**-8).max().item()
    assert excess <= 1e-3, f"sharp softmax: error beyond bf16 rounding {excess:.3g}"


@pytest.mark.parametrize("kv_dtype", ["bf16", "int8"])
def test_split_request_is_deterministic_and_layers_op_matches(op, kv_dtype) -> None:
    """A long request is cut into chunks that the threads take from a shared counter, whichever thread
    gets there first; each chunk's partial result has its own slot, merged in token order, so repeated
    calls give bit-identical outputs. The benchmarks' layers op (each layer's call made back
    to back from C++) gives each layer's call's output bit for bit."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(max(2, threads))
        if kv_dtype == "int8":
            q, k, v, ks, vs, tables, lens = quantised_case([5000], 16, 8, 128, torch.bfloat16, "int8", seed=11)
            scales = ([ks, ks.flip(0)], [vs, vs.flip(0)])
        else:
            q, k, v, tables, lens = make_case([5000], 16, 8, 128, torch.bfloat16, seed=11)
            scales = ([], [])
        ks_l, vs_l = scales
        k_l, v_l = [k, k.flip(0)], [v, v.flip(0)]  # two layers
        first = [op(q, k_l[i], v_l[i], tables, lens, 128**-0.5, *((ks_l[i], vs_l[i]) if ks_l else ())) for i in range(2)]
        for _ in range(5):
            again = op(q, k_l[0], v_l[0], tables, lens, 128**-0.5, *((ks_l[0], vs_l[0]) if ks_l else ()))
            assert torch.equal(again, first[0])
        layers = torch.ops.swiftlm_attention.paged_decode_attention_layers(q, k_l, v_l, tables, lens, 128**-0.5, ks_l, vs_l)
        assert len(layers) == 2 and all(torch.equal(a, b) for a, b in zip(layers, first, strict=True))
        with pytest.raises(RuntimeError, match="same layers"):
            torch.ops.swiftlm_attention.paged_decode_attention_layers(q, k_l, v_l[:1], tables, lens, 0.1, [], [])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("d", [128, 64])
def test_int8_pools_with_strided_heads_match_dense_ones(op, d) -> None:
    """int8 q.k takes two K rows at a time with addresses fixed at compile time when a row's kv heads
    are adjacent (stride head_dim), and at runtime strides otherwise: pools whose heads sit 2 * head_dim
    apart (a view of a wider tensor) must give the dense pools' outputs bit for bit."""
    q, kq, vq, ks, vs, tables, lens = quantised_case(MIXED_LENS, 16, 8, d, torch.bfloat16, "int8", seed=13)
    dense = op(q, kq, vq, tables, lens, d**-0.5, ks, vs)
    wide_k = torch.zeros(*kq.shape[:3], 2 * d, dtype=kq.dtype)
    wide_v = torch.zeros_like(wide_k)
    wide_k[..., :d], wide_v[..., :d] = kq, vq
    strided = op(q, wide_k[..., :d], wide_v[..., :d], tables, lens, d**-0.5, ks, vs)
    assert wide_k[..., :d].stride(2) == 2 * d
    assert torch.equal(dense, strided)
