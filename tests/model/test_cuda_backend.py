"""The CUDA backend's Python logic on CPU tensors, its Triton kernels under the interpreter
(``CudaBackend(device="cpu", interpret=True)``), against the plain torch backend; and the clear
error of ``--device cuda`` on a machine without CUDA."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from swiftlm import LLM, SamplingParams
from swiftlm.backends.cuda.device import CudaUnavailableError
from swiftlm.backends.torch import TorchBackend
from swiftlm.cli import main
from tests.conftest import make_tiny_model
from tests.unit.triton_interpreted import import_interpreted, interpreter_env, triton_installed

CUDA = torch.cuda.is_available()
if not triton_installed():
    pytest.fail("triton is not installed: pip install -e .[test]", pytrace=False)
# at collection, before any test runs: loading a transformers model imports triton (through torch._dynamo)
MODULES = import_interpreted()


@pytest.fixture(scope="module")
def interpreted_backend() -> Iterator[type]:
    with interpreter_env():
        yield MODULES["backend"].CudaBackend


def greedy_tokens(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]


def test_generation_through_the_triton_attention_equals_the_torch_backend(
    interpreted_backend: type, tiny_untied_dir: Path
) -> None:
    """float32 greedy tokens identical over a batch with a shared prefix (prefix hits), prompts
    longer than a step's budget (chunked prefill beside decode rows) and block boundaries."""
    shared = list(range(300, 313))  # 13 tokens: three whole blocks of 4, then one more
    prompts = [shared + [7, 8, 9], list(range(500, 530)), shared + [11], [42]]
    engine = dict(dtype="float32", block_size=4, max_num_batched_tokens=24, max_num_seqs=4, num_blocks=64)
    backend = interpreted_backend(device="cpu", interpret=True)
    triton_llm = LLM(str(tiny_untied_dir), backend=backend, **engine)
    assert "attention: Triton" in backend.describe()
    assert backend.step_plan is not None  # norms, q/k norm + rotary, SiLU-multiply: the fused Triton kernels
    assert type(triton_llm.engine.runner.attention).__name__ == "TritonPagedAttention"
    plain = greedy_tokens(LLM(str(tiny_untied_dir), backend=TorchBackend("cpu"), **engine), prompts, 6)
    first = greedy_tokens(triton_llm, prompts, 6)
    assert len({t for seq in plain for t in seq}) > 4  # the tokens depend on attention: a wrong kernel shows
    assert first == plain
    assert greedy_tokens(triton_llm, prompts[:1], 6) == plain[:1]  # again: its prompt now a prefix hit
    hits = triton_llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(max_tokens=1))[0]
    assert hits.num_cached_tokens >= 12


def test_a_quantised_kv_cache_falls_back_to_the_reference(interpreted_backend: type, tiny_tied_dir: Path) -> None:
    backend = interpreted_backend(device="cpu", interpret=True)
    llm = LLM(str(tiny_tied_dir), backend=backend, dtype="float32", kv_cache_dtype="int8", num_blocks=16)
    assert any(f.op == "attention" for f in backend.fallbacks)
    assert type(llm.engine.runner.attention).__name__ == "PagedAttention"


@pytest.mark.skipif(CUDA, reason="this machine has CUDA: the error is for machines without it")
def test_device_cuda_without_cuda_is_a_clear_error(tiny_tied_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(CudaUnavailableError, match="--device cuda: .*run with --device cpu"):
        LLM(str(tiny_tied_dir), device="cuda")
    assert main(["generate", "--model", str(tiny_tied_dir), "--device", "cuda:1", "hello"]) == 2
    assert "error: --device cuda:1:" in capsys.readouterr().err


@pytest.mark.parametrize(("head_dim", "fused"), [(15, False), (20, True)])
def test_an_odd_head_dim_falls_back_to_the_models_own_forward(
    interpreted_backend: type, tmp_path: Path, head_dim: int, fused: bool
) -> None:
    """head_dim 15: the fused q/k norm + rotary kernel pairs halves, so the model's own forward runs
    (named among the fallbacks); 20: a half of 10, padded in the kernel. Greedy tokens identical to the
    plain torch backend either way."""
    shape = {"hidden_size": 48, "intermediate_size": 72, "num_hidden_layers": 2, "num_attention_heads": 3,
             "num_key_value_heads": 1, "head_dim": head_dim, "max_position_embeddings": 256,
             "tie_word_embeddings": False}
    path = make_tiny_model(tmp_path / "model", shape, seed=5)
    engine = dict(dtype="float32", block_size=4, max_num_seqs=2, num_blocks=32)
    backend = interpreted_backend(device="cpu", interpret=True)
    llm = LLM(str(path), backend=backend, **engine)
    assert (backend.step_plan is not None) == fused
    assert ("fused elementwise kernels" in backend.describe()) == (not fused)
    prompts = [list(range(40, 49)), [3, 1, 4, 1, 5]]
    plain = greedy_tokens(LLM(str(path), backend=TorchBackend("cpu"), **engine), prompts, 5)
    assert greedy_tokens(llm, prompts, 5) == plain
