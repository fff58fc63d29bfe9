"""The decode layers op (all layers of a small decode-only step in C++) against the Python loop of
fused_forward, which runs the same kernels: logits, logprobs and KV pools bit for bit the same."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swiftlm import LLM, SamplingParams
from swiftlm.kernels.amx_linear_cpu import load_amx_linear
from swiftlm.kernels.decode_cpu import load_decode_layers
from swiftlm.model.cpu_linear import GemvLinear
from swiftlm.model.decode_layers import DecodeLayers
from swiftlm.model.quant import QuantLinear

pytestmark = pytest.mark.skipif(load_decode_layers() is None, reason="needs the AVX512-BF16 kernels")
PARAMS = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=3)


def params(i: int) -> SamplingParams:
    """Request i stops after 4 + i tokens: batches shrink one request a step as requests finish."""
    return SamplingParams(temperature=0.0, max_tokens=4 + i, ignore_eos=True, logprobs=3)


def prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 151643, (int(k),), generator=g).tolist() for k in torch.randint(1, 90, (n,), generator=g)]


def outputs(llm: LLM, batch: list[list[int]]) -> list[tuple[list[int], list]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in batch], [params(i) for i in range(len(batch))])
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


def counting(llm: LLM) -> list[int]:
    """Wrap the model's DecodeLayers so that each call records its batch size."""
    model = llm.engine.model.model
    assert model.decode_op is not None
    calls: list[int] = []
    op = model.decode_op

    def counted(residual, h, *args):
        calls.append(h.shape[0])
        return op(residual, h, *args)

    model.decode_op = counted
    model.fused_plan = None  # rebuilt, with the counting op, at the next forward
    return calls


@pytest.mark.parametrize("path", ["amx", "gemv-only", "int8", "int4"])
@pytest.mark.parametrize("batch", [1, 3, 9, 34])
def test_decode_layers_equal_python_loop(tiny_model_dir: Path, batch: int, path: str, monkeypatch) -> None:
    """bf16 without AMX: the op takes up to 6 rows through the GEMV kernel; with AMX, 1 row through
    the GEMV kernel and 2-32 through AMX; int8 / int4: up to 64 rows through the quantised GEMV
    kernels. Every way it must equal the Python loop over the same layers."""
    if path == "amx" and load_amx_linear() is None:
        pytest.skip("no AMX here")
    if path == "gemv-only":
        monkeypatch.setattr("swiftlm.kernels.amx_linear_cpu.load_amx_linear", lambda: None)
    quantization = path if path in ("int8", "int4") else None
    # every prompt prefills in the first step, so that decode steps shrink from the whole batch to 1
    kwargs = {"dtype": "bfloat16", "quantization": quantization, "max_num_batched_tokens": 4096, "max_num_seqs": 64}
    fast = LLM(str(tiny_model_dir), **kwargs)
    calls = counting(fast)
    slow = LLM(str(tiny_model_dir), **kwargs)
    slow.engine.model.model.decode_op = None
    slow.engine.model.model.fused_plan = None
    batch_prompts = prompts(batch, seed=batch)
    assert outputs(fast, batch_prompts) == outputs(slow, batch_prompts)
    assert slow.engine.model.model.decode_layers is None
    layers = fast.engine.model.model.decode_layers
    assert layers.max_rows == {"amx": GemvLinear.AMX_MAX_ROWS, "gemv-only": GemvLinear.GEMV_MAX_ROWS}.get(
        path, QuantLinear.GEMV_MAX_ROWS)
    # decode steps of up to max_rows rows went through the op, larger ones through the Python loop
    assert sorted(set(calls)) == list(range(1, min(batch, layers.max_rows) + 1))
    # the KV pools hold the same K/V, bit for bit
    for layer in range(fast.engine.model.config.num_hidden_layers):
        for a, b in zip(fast.engine.kv_cache.layer(layer), slow.engine.kv_cache.layer(layer), strict=True):
            assert torch.equal(a, b)


def test_layers_the_op_cannot_run_keep_the_python_loop(tiny_model_dir: Path) -> None:
    """int8 layers switched to the float64 reference path: the plan is rebuilt without the op."""
    from swiftlm.model.quant import dequantized_reference

    llm = LLM(str(tiny_model_dir), dtype="bfloat16", quantization="int8")
    llm.generate([{"prompt_token_ids": [5, 6, 7]}], PARAMS)
    assert llm.engine.model.model.decode_layers is not None
    ref = dequantized_reference(llm.engine.model, "int8")
    assert ref.model.fused_plan is None
    assert not DecodeLayers.supports(ref.model)


def test_bad_slot_is_an_error_not_a_write(tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), dtype="bfloat16")
    llm.generate([{"prompt_token_ids": [5, 6, 7]}], PARAMS)
    model = llm.engine.model.model
    layers = model.decode_layers
    assert layers is not None
    k_pools, v_pools = llm.engine.kv_cache.pools()
    before = [p.clone() for p in k_pools]
    hidden = model.embed_tokens.weight.shape[1]
    residual, h = torch.zeros(1, hidden, dtype=torch.bfloat16), torch.zeros(1, hidden, dtype=torch.bfloat16)
    num_slots = k_pools[0].shape[0] * k_pools[0].shape[1]
    with pytest.raises(RuntimeError, match="outside the pool"):
        layers.op(residual, h, torch.tensor([0]), torch.tensor([num_slots]), torch.zeros(1, 1, dtype=torch.long),
                  torch.tensor([1]), layers.weights, k_pools, v_pools, layers.cos, layers.sin, layers.n_heads,
                  layers.n_kv_heads, layers.eps, layers.scale, layers.gemv_max_rows, layers.kind, layers.quant,
                  layers.intermediate)
    assert all(torch.equal(a, b) for a, b in zip(before, k_pools, strict=True))
