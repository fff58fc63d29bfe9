"""The fused elementwise ops against the plain torch code of swiftlm.model.layers they replace: the
CPU backend's (C++) and the CUDA backend's (Triton kernels, under Triton's interpreter on CPU
tensors)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from swiftlm.backends.cpu.kernels.fused_cpu import load_fused_ops
from swiftlm.backends.fused_forward import FusedOps
from swiftlm.model.layers import RMSNorm, RotaryEmbedding, apply_rotary
from tests.unit.triton_interpreted import import_interpreted, interpreter_env, triton_installed

if not triton_installed():
    pytest.fail("triton is not installed: pip install -e .[test]", pytrace=False)

TRITON_OPS = import_interpreted()["fused_ops"]
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module")
def cpu_ops() -> FusedOps:
    loaded = load_fused_ops()
    assert loaded is not None, "the fused ops are plain C++ and must build wherever torch extensions do"
    return loaded


@pytest.fixture(scope="module", params=["cpu", "triton"])
def ops(request: pytest.FixtureRequest, cpu_ops: FusedOps) -> Iterator[FusedOps]:
    if request.param == "cpu":
        yield cpu_ops
        return
    with interpreter_env():
        yield TRITON_OPS.triton_fused_ops()


def _rows(ops: FusedOps, rows: int) -> int:
    """The row count a case runs: the Triton kernels (one program per row, interpreted one by one)
    take at most 12; the large counts are there for the CPU ops' split of rows over threads."""
    return rows if ops is load_fused_ops() else min(rows, 12)


def _assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    """float32: equal to float rounding. bf16: every value equal, or one bf16 step away where the
    float32 norm statistic (summed in another order) landed on the other side of a rounding tie."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        return
    diff = (got.float() - want.float()).abs()
    step = want.float().abs() * 2.0**-7 + 1e-30
    assert (diff <= step).all()
    assert (diff == 0).float().mean() > 0.99


def _norm(dim: int, dtype: torch.dtype, seed: int) -> RMSNorm:
    norm = RMSNorm(dim, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim, generator=torch.Generator().manual_seed(seed)) * 0.5 + 1)
    return norm.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 700])
def test_rms_norm(ops, dtype: torch.dtype, rows: int) -> None:
    rows = _rows(ops, rows)
    norm = _norm(96, dtype, rows)
    x = (torch.randn(rows, 96, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    _assert_same(ops.rms_norm(x, norm.weight, norm.eps), norm(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 5, 600])
def test_add_rms_norm_updates_the_residual_in_place(ops, dtype: torch.dtype, rows: int) -> None:
    rows = _rows(ops, rows)
    norm = _norm(64, dtype, 2)
    g = torch.Generator().manual_seed(rows)
    residual = torch.randn(rows, 64, generator=g).to(dtype)
    delta = torch.randn(rows, 64, generator=g).to(dtype)
    want_residual = residual + delta
    out = ops.add_rms_norm_(residual, delta, norm.weight, norm.eps)
    assert torch.equal(residual, want_residual)  # one rounded add, as torch's
    _assert_same(out, norm(want_residual))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "dh"), [(1, 32), (4, 32), (300, 32), (3, 20), (2, 128)])
def test_qk_norm_rope(ops, dtype: torch.dtype, rows: int, dh: int) -> None:
    rows = _rows(ops, rows)
    hq, hk = 4, 2
    g = torch.Generator().manual_seed(rows)
    qkv = torch.randn(rows, (hq + 2 * hk) * dh, generator=g).to(dtype)
    q_norm, k_norm = _norm(dh, dtype, 3), _norm(dh, dtype, 4)
    rotary = RotaryEmbedding(dh, 4096, 1_000_000.0)
    positions = torch.randint(0, 4096, (rows,), generator=g)
    q, k = ops.qk_norm_rope(qkv, q_norm.weight, k_norm.weight, rotary.cos_cached, rotary.sin_cached,
                            positions, hq, hk, q_norm.eps)
    q_ref = q_norm(qkv[:, : hq * dh].reshape(rows, hq, dh))
    k_ref = k_norm(qkv[:, hq * dh : (hq + hk) * dh].reshape(rows, hk, dh))
    q_ref, k_ref = apply_rotary(q_ref, k_ref, rotary.table(positions, dtype))
    _assert_same(q, q_ref)
    _assert_same(k, k_ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_qk_norm_rope_without_norm_weights_only_rotates(ops, dtype: torch.dtype) -> None:
    hq, hk, dh, rows = 3, 1, 16, 5  # Llama and Qwen2 have no q/k norm
    qkv = torch.randn(rows, (hq + 2 * hk) * dh, generator=torch.Generator().manual_seed(9)).to(dtype)
    rotary = RotaryEmbedding(dh, 64, 10000.0)
    positions = torch.arange(rows) * 7
    empty = torch.empty(0, dtype=dtype)
    q, k = ops.qk_norm_rope(qkv, empty, empty, rotary.cos_cached, rotary.sin_cached, positions, hq, hk, 0.0)
    q_ref, k_ref = apply_rotary(qkv[:, : hq * dh].reshape(rows, hq, dh),
                                qkv[:, hq * dh : (hq + hk) * dh].reshape(rows, hk, dh), rotary.table(positions, dtype))
    _assert_same(q, q_ref)
    _assert_same(k, k_ref)


def test_qk_norm_rope_rejects_positions_outside_the_table(cpu_ops) -> None:
    ops = cpu_ops
    rotary = RotaryEmbedding(16, 8, 10000.0)
    w = torch.ones(16)
    with pytest.raises(RuntimeError, match="outside"):
        ops.qk_norm_rope(torch.zeros(1, 64), w, w, rotary.cos_cached, rotary.sin_cached,
                         torch.tensor([8]), 2, 1, 1e-6)
    with pytest.raises(RuntimeError, match="width"):
        ops.qk_norm_rope(torch.zeros(1, 60), w, w, rotary.cos_cached, rotary.sin_cached,
                         torch.tensor([0]), 2, 1, 1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 300])
def test_silu_mul(ops, dtype: torch.dtype, rows: int) -> None:
    rows = _rows(ops, rows)
    gate_up = (torch.randn(rows, 2 * 160, generator=torch.Generator().manual_seed(rows)) * 4).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    _assert_same(ops.silu_mul(gate_up), F.silu(gate) * up)


@pytest.mark.parametrize("vocab", [1, 15, 16, 17, 151936])
def test_greedy_pick_is_torch_max_with_the_lowest_id_on_ties(ops, vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=g).bfloat16().float()  # bf16 values: ties happen
    if vocab > 1:
        top = logits[1].max()
        logits[1, vocab // 2] = top  # a tie with the earlier maximum...
        logits[1, vocab - 1] = top  # ...and a later one
        logits[2] = 0.0  # every id tied: id 0
        logits[3, vocab - 1] = logits[3].max() + 1  # the maximum in the tail past whole 16-lane groups
    ids, finite = ops.greedy_pick(logits)
    assert ids.dtype == torch.int64 and finite.dtype == torch.bool
    assert ids.tolist() == logits.max(dim=-1).indices.tolist()
    assert finite.tolist() == [True] * 5


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", [0, 16, 150000, 151935])
def test_greedy_pick_flags_rows_with_non_finite_logits(ops, bad: float, where: int) -> None:
    logits = torch.randn(3, 151936, generator=torch.Generator().manual_seed(where))
    logits[1, where] = bad
    ids, finite = ops.greedy_pick(logits)
    assert finite.tolist() == [True, False, True]
    assert ids[[0, 2]].tolist() == logits[[0, 2]].max(dim=-1).indices.tolist()
    assert 0 <= int(ids[1]) < logits.shape[1]


def test_greedy_pick_of_an_all_nan_row_is_id_0(ops) -> None:
    ids, finite = ops.greedy_pick(torch.full((1, 40), float("nan")))
    assert ids.tolist() == [0] and finite.tolist() == [False]


def test_greedy_pick_rejects_other_dtypes_and_shapes(cpu_ops) -> None:
    ops = cpu_ops
    with pytest.raises(RuntimeError, match="float32"):
        ops.greedy_pick(torch.zeros(1, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="float32"):
        ops.greedy_pick(torch.zeros(8))
