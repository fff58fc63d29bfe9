"""The decode layers op (all layers of a small decode-only step in C++) against the Python loop of
fused_forward, which runs the same kernels: logits, logprobs and KV pools bit for bit the same.

The backends are built explicitly: the op wrapped to count its calls, or left out by configuration
(``cpu_disable_kernels``). On a CPU with the kernels' instruction sets, a kernel that does not
load is a failure, not a skip."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from swiftlm import LLM, SamplingParams
from swiftlm.backends.cpu.backend import CpuBackend
from swiftlm.backends.cpu.decode import DecodeLayers
from swiftlm.backends.cpu.kernels.attention_cpu import REQUIRED_CPU_FLAGS as ATTENTION_FLAGS
from swiftlm.backends.cpu.kernels.bf16_linear_cpu import REQUIRED_CPU_FLAGS as GEMV_FLAGS
from swiftlm.backends.cpu.kernels.quant_cpu import REQUIRED_CPU_FLAGS as QUANT_FLAGS
from swiftlm.backends.cpu.limits import (
    GEMV_ROWS_WITHOUT_AMX,
    GEMV_ROWS_WITHOUT_DENSE_BF16,
    QUANT_GEMV_ROWS,
    QUANT_GEMV_ROWS_WITHOUT_AMX,
)
from swiftlm.backends.cpu.linear import can_pack
from swiftlm.backends.cpu.ops import CpuKernels
from swiftlm.backends.quant import dequantized_reference
from swiftlm.platform import cpu_flags

PARAMS = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=3)
NEEDS = (*GEMV_FLAGS, *ATTENTION_FLAGS)  # the op's kernels: bf16 GEMV, paged attention, fused ops


@pytest.fixture(scope="module")
def kernels() -> CpuKernels:
    loaded = CpuKernels.load()
    if loaded.decode_layers is None:
        missing = [f for f in NEEDS if f not in cpu_flags()]
        if not missing:
            pytest.fail(f"the decode layers op did not load on a CPU with {', '.join(NEEDS)}: {loaded.missing}")
        pytest.skip(f"CPU without {', '.join(missing)}")
    return loaded


def need_quant(kernels: CpuKernels) -> None:
    """Skip where the quantised GEMV kernels cannot run (a CPU without AVX512-VNNI); fail where they should."""
    if kernels.quant is None:
        assert not all(f in cpu_flags() for f in QUANT_FLAGS), f"no quantised GEMV kernels: {kernels.missing}"
        pytest.skip(f"quantised GEMV kernels unavailable: CPU lacks {QUANT_FLAGS}")


def params(i: int) -> SamplingParams:
    """Request i stops after 4 + i tokens: batches shrink one request a step as requests finish."""
    return SamplingParams(temperature=0.0, max_tokens=4 + i, ignore_eos=True, logprobs=3)


def prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 151643, (int(k),), generator=g).tolist() for k in torch.randint(1, 90, (n,), generator=g)]


def outputs(llm: LLM, batch: list[list[int]]) -> list[tuple[list[int], list]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in batch], [params(i) for i in range(len(batch))])
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


def counting(kernels: CpuKernels, calls: list[int]) -> CpuKernels:
    """The same kernels with the decode layers op recording each call's batch size."""
    op = kernels.decode_layers

    def counted(residual, h, *args):
        calls.append(h.shape[0])
        return op(residual, h, *args)

    return dataclasses.replace(kernels, decode_layers=counted)


@pytest.mark.parametrize("path", ["amx", "gemv-only", "int8", "int4"])
@pytest.mark.parametrize("batch", [1, 3, 9, 34])
def test_decode_layers_equal_python_loop(kernels: CpuKernels, tiny_model_dir: Path, batch: int, path: str) -> None:
    """bf16 without AMX: the op takes up to 6 rows through the GEMV kernel; with AMX, 1 row through
    the GEMV kernel and 2-32 through AMX; int8 / int4: up to 64 rows through the quantised GEMV
    kernels. Every way it must equal the Python loop over the same layers."""
    if path == "amx" and kernels.amx is None:
        pytest.skip("no AMX here")
    if path == "int8" or path == "int4":
        need_quant(kernels)
    base = dataclasses.replace(kernels, amx=None) if path == "gemv-only" else kernels
    quantization = path if path in ("int8", "int4") else None
    # every prompt prefills in the first step, so that decode steps shrink from the whole batch to 1
    kwargs = {"dtype": "bfloat16", "quantization": quantization, "max_num_batched_tokens": 4096, "max_num_seqs": 64}
    calls: list[int] = []
    fast = LLM(str(tiny_model_dir), backend=CpuBackend(kernels=counting(base, calls)), **kwargs)
    slow = LLM(str(tiny_model_dir), backend=CpuBackend(kernels=dataclasses.replace(base, decode_layers=None)),
               **kwargs)
    batch_prompts = prompts(batch, seed=batch)
    assert outputs(fast, batch_prompts) == outputs(slow, batch_prompts)
    assert slow.engine.backend.step_plan.decode_layers is None
    assert "decode layers op" in slow.engine.backend.describe()  # named as a fallback
    layers = fast.engine.backend.step_plan.decode_layers
    # without AMX the GEMV takes 6 rows, or every row count where oneDNN has no bf16 matmul (AVX2 CPUs)
    gemv_rows = GEMV_ROWS_WITHOUT_AMX if can_pack(torch.bfloat16) else GEMV_ROWS_WITHOUT_DENSE_BF16
    quant_rows = QUANT_GEMV_ROWS if kernels.amx else QUANT_GEMV_ROWS_WITHOUT_AMX  # without AMX: every row count
    assert layers.max_rows == {"amx": kernels.amx.max_rows if kernels.amx else 0, "gemv-only": gemv_rows}.get(path, quant_rows)
    # decode steps of up to max_rows rows went through the op, larger ones through the Python loop
    assert sorted(set(calls)) == list(range(1, min(batch, layers.max_rows) + 1))
    # the KV pools hold the same K/V, bit for bit
    for layer in range(fast.engine.model.config.num_hidden_layers):
        for a, b in zip(fast.engine.kv_cache.layer(layer), slow.engine.kv_cache.layer(layer), strict=True):
            assert torch.equal(a, b)


def test_layers_the_op_cannot_run_keep_the_python_loop(kernels: CpuKernels, tiny_model_dir: Path) -> None:
    """int8 layers switched to the float64 reference path: the op does not apply to them."""
    need_quant(kernels)
    llm = LLM(str(tiny_model_dir), dtype="bfloat16", quantization="int8", backend=CpuBackend(kernels=kernels))
    llm.generate([{"prompt_token_ids": [5, 6, 7]}], PARAMS)
    assert llm.engine.backend.step_plan.decode_layers is not None
    assert DecodeLayers.supports(llm.engine.model.model) is None
    ref = dequantized_reference(llm.engine.model, "int8")
    assert DecodeLayers.supports(ref.model) is not None


def test_bad_slot_is_an_error_not_a_write(kernels: CpuKernels, tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), dtype="bfloat16", backend=CpuBackend(kernels=kernels))
    llm.generate([{"prompt_token_ids": [5, 6, 7]}], PARAMS)
    model = llm.engine.model.model
    layers = llm.engine.backend.step_plan.decode_layers
    assert layers is not None
    k_pools, v_pools = llm.engine.kv_cache.pools()
    before = [p.clone() for p in k_pools]
    hidden = model.embed_tokens.weight.shape[1]
    residual, h = torch.zeros(1, hidden, dtype=torch.bfloat16), torch.zeros(1, hidden, dtype=torch.bfloat16)
    num_slots = k_pools[0].shape[0] * k_pools[0].shape[1]
    with pytest.raises(RuntimeError, match="outside the pool"):
        layers.op(residual, h, torch.tensor([0]), torch.tensor([num_slots]), torch.zeros(1, 1, dtype=torch.long),
                  torch.tensor([1]), layers.weights, k_pools, v_pools, layers.cos, layers.sin, layers.n_heads,
                  layers.n_kv_heads, layers.eps, layers.scale, layers.gemv_max_rows, layers.max_rows, layers.kind,
                  layers.quant, layers.intermediate, [], [])
    assert all(torch.equal(a, b) for a, b in zip(before, k_pools, strict=True))


@pytest.mark.parametrize(("table", "lens", "message"), [
    ("past_pool", 1, "outside the pool"),
    ("negative", 1, "outside the pool"),
    ("ok", 99, "does not fit"),
])
def test_bad_block_table_is_an_error_before_any_write(
    kernels: CpuKernels, tiny_model_dir: Path, table: str, lens: int, message: str
) -> None:
    """The op checks the attention's tables once for every layer (the kernel trusts them), before any
    layer writes its pools."""
    llm = LLM(str(tiny_model_dir), dtype="bfloat16", backend=CpuBackend(kernels=kernels))
    llm.generate([{"prompt_token_ids": [5, 6, 7]}], PARAMS)
    layers = llm.engine.backend.step_plan.decode_layers
    assert layers is not None
    k_pools, v_pools = llm.engine.kv_cache.pools()
    before = [p.clone() for p in (*k_pools, *v_pools)]
    hidden = llm.engine.model.model.embed_tokens.weight.shape[1]
    residual, h = torch.zeros(1, hidden, dtype=torch.bfloat16), torch.zeros(1, hidden, dtype=torch.bfloat16)
    block = {"past_pool": k_pools[0].shape[0], "negative": -1, "ok": 1}[table]
    with pytest.raises(RuntimeError, match=message):
        layers.op(residual, h, torch.tensor([0]), torch.tensor([0]), torch.tensor([[block]]), torch.tensor([lens]),
                  layers.weights, k_pools, v_pools, layers.cos, layers.sin, layers.n_heads, layers.n_kv_heads,
                  layers.eps, layers.scale, layers.gemv_max_rows, layers.max_rows, layers.kind, layers.quant,
                  layers.intermediate, [], [])
    assert all(torch.equal(a, b) for a, b in zip(before, (*k_pools, *v_pools), strict=True))


@pytest.mark.parametrize("path", ["bf16", "int8"])
def test_decode_layers_on_llama_and_qwen2(kernels: CpuKernels, tiny_arch_dir: Path, path: str) -> None:
    """Llama has no q/k norm (the op rotates the heads as they are); Qwen2's q/k/v biases keep the
    Python loop (the op takes bias-free linears). Either way the outputs equal the loop's. bf16
    weights: GEMV rows, and AMX rows where the CPU has AMX."""
    if path == "int8":
        need_quant(kernels)
    kwargs = {"dtype": "bfloat16", "quantization": None if path == "bf16" else path, "max_num_batched_tokens": 4096}
    calls: list[int] = []
    fast = LLM(str(tiny_arch_dir), backend=CpuBackend(kernels=counting(kernels, calls)), **kwargs)
    slow = LLM(str(tiny_arch_dir), backend=CpuBackend(kernels=dataclasses.replace(kernels, decode_layers=None)),
               **kwargs)
    batch_prompts = prompts(5, seed=21)
    assert outputs(fast, batch_prompts) == outputs(slow, batch_prompts)
    if fast.engine.model.config.qkv_bias:
        assert fast.engine.backend.step_plan.decode_layers is None and not calls
    else:
        assert calls and max(calls) <= fast.engine.backend.step_plan.decode_layers.max_rows
