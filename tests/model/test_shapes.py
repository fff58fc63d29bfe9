"""Checkpoints of many shapes through ``LLM`` on the CPU backend with its kernels on: greedy tokens
in float32 identical to the plain torch backend and to transformers, bf16 running too, and the
backend naming the ops that fell back (a kernel's precondition is a fallback, never a crash).

The shapes cover head_dim 24, 40, 48, 64, 80, 128, GQA ratios 1-4, tied and untied embeddings, and
widths the kernels cannot take (hidden 80, intermediate 100, heads * head_dim 144 or 240).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from swiftlm import LLM, SamplingParams
from swiftlm.backends.cpu.backend import CpuBackend
from swiftlm.backends.cpu.kernels.amx_linear_cpu import REQUIRED_CPU_FLAGS as AMX_FLAGS
from swiftlm.backends.cpu.kernels.attention_cpu import REQUIRED_CPU_FLAGS as ATTENTION_FLAGS
from swiftlm.backends.cpu.kernels.bf16_linear_cpu import REQUIRED_CPU_FLAGS as GEMV_FLAGS
from swiftlm.backends.cpu.kernels.gemm_cpu import REQUIRED_CPU_FLAGS as GEMM_FLAGS
from swiftlm.backends.cpu.kernels.prefill_attention_cpu import REQUIRED_CPU_FLAGS as PREFILL_FLAGS
from swiftlm.backends.cpu.kernels.prefill_attention_cpu import supports as prefill_supports
from swiftlm.backends.cpu.kernels.quant_cpu import REQUIRED_CPU_FLAGS as QUANT_FLAGS
from swiftlm.backends.cpu.ops import KERNELS, CpuKernels
from swiftlm.backends.torch import TorchBackend
from swiftlm.platform import cpu_flags
from tests.conftest import make_tiny_model
from tests.helpers.hf_reference import hf_greedy, hf_model

# float32 activations: these kernels take bf16 only
FLOAT32_ONLY = {"bf16 GEMV", "decode layers op"}


@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    shape_fallbacks: frozenset[str]  # the ops that must fall back in bf16 for the shape (on a CPU with every kernel)

    def config(self) -> dict:
        return {"hidden_size": self.hidden, "intermediate_size": self.intermediate, "num_hidden_layers": 2,
                "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads,
                "head_dim": self.head_dim, "max_position_embeddings": 2048, "tie_word_embeddings": self.tied}

    def prefill_fallback(self, dtype: torch.dtype) -> frozenset[str]:
        """The prefill kernel's fallback where it does not take the shape in ``dtype`` on this CPU (head_dim;
        bf16 on a CPU with AMX or without AVX512-BF16)."""
        refused = prefill_supports(dtype, self.head_dim, self.heads, self.kv_heads) is not None
        return frozenset({"prefill attention"}) if refused else frozenset()

    @property
    def bf16_fallbacks(self) -> frozenset[str]:
        return self.shape_fallbacks | self.prefill_fallback(torch.bfloat16)

    @property
    def float32_fallbacks(self) -> frozenset[str]:
        return frozenset(FLOAT32_ONLY | ({"decode attention"} & self.shape_fallbacks)
                         | self.prefill_fallback(torch.float32))


ATTENTION, GEMV, DECODE = "decode attention", "bf16 GEMV", "decode layers op"
SHAPES = {
    # head_dim 24 (the shape that crashed): o_proj's 144 inputs are not a GEMV width either
    "hd24-gqa2-tied": Shape(96, 6, 3, 24, 192, True, frozenset({ATTENTION, GEMV, DECODE})),
    "hd40-mha-untied": Shape(80, 2, 2, 40, 160, False, frozenset({ATTENTION, GEMV, DECODE})),
    "hd48-gqa3-tied": Shape(96, 6, 2, 48, 256, True, frozenset()),
    "hd64-gqa4-untied": Shape(128, 8, 2, 64, 384, False, frozenset()),
    "hd80-gqa3-untied": Shape(64, 3, 1, 80, 100, False, frozenset({GEMV, DECODE})),
    "hd128-gqa4-tied": Shape(128, 4, 1, 128, 256, True, frozenset()),
    "hd64-mha-untied": Shape(128, 2, 2, 64, 256, False, frozenset()),
}
# each kernel and the instruction sets it needs (the fused ops need none)
KERNEL_FLAGS = {"fused_ops": (), "gemv": GEMV_FLAGS, "gemm": GEMM_FLAGS, "attention": ATTENTION_FLAGS, "amx": AMX_FLAGS,
                "prefill_attention": PREFILL_FLAGS, "decode_layers": (*GEMV_FLAGS, *ATTENTION_FLAGS),
                "quant": QUANT_FLAGS, "token_draw": ()}


def prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 151643, (n,), generator=g).tolist() for n in lengths]


def greedy(llm: LLM, batch: list[list[int]], steps: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in batch], params)]


def fallbacks(llm: LLM) -> set[str]:
    return {f.op for f in llm.engine.backend.fallbacks}


@pytest.fixture(scope="module")
def kernels() -> CpuKernels:
    loaded = CpuKernels.load()
    assert set(KERNEL_FLAGS) == set(KERNELS)
    runnable = {k for k, flags in KERNEL_FLAGS.items() if all(f in cpu_flags() for f in flags)}
    missing = {k: why for k, why in loaded.missing.items() if k in runnable}
    assert not missing, f"kernels did not load on a CPU with their instruction sets: {missing}"
    return loaded


@pytest.fixture(scope="module", params=sorted(SHAPES))
def shape_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    name = request.param
    return name, make_tiny_model(tmp_path_factory.mktemp(name), SHAPES[name].config(), seed=len(name))


def check_shape(kernels: CpuKernels, name: str, path: Path, lengths: tuple[int, ...], steps: int,
                caplog: pytest.LogCaptureFixture) -> None:
    shape = SHAPES[name]
    batch = prompts(seed=len(name), lengths=lengths)
    with caplog.at_level(logging.INFO, logger="swiftlm"):
        fast = LLM(str(path), dtype="float32", backend=CpuBackend(kernels=kernels))
    got = greedy(fast, batch, steps)
    plain = greedy(LLM(str(path), dtype="float32", backend=TorchBackend("cpu")), batch, steps)
    ref = hf_model(path, torch.float32)
    expected = [hf_greedy(ref, p, steps)[0] for p in batch]
    assert got == plain, f"{name}: CPU backend and torch backend differ in float32"
    assert got == expected, f"{name}: CPU backend and transformers differ in float32"
    if not kernels.missing:  # every kernel here: the fallbacks are exactly the shape's
        assert fallbacks(fast) == shape.float32_fallbacks
    for op in fallbacks(fast):
        assert f"fallback to the reference: {op}:" in caplog.text  # the engine logged the plan
    bf16 = LLM(str(path), dtype="bfloat16", backend=CpuBackend(kernels=kernels))
    if not kernels.missing:
        assert fallbacks(bf16) == shape.bf16_fallbacks
    fast_bf16 = greedy(bf16, batch, steps)
    torch_bf16 = greedy(LLM(str(path), dtype="bfloat16", backend=TorchBackend("cpu")), batch, steps)
    assert [len(t) for t in fast_bf16] == [steps] * len(batch)
    share = _share_before_divergence(fast_bf16, got)
    torch_share = _share_before_divergence(torch_bf16, got)
    print(f"{name}: float32 greedy identical to torch and transformers; bf16 positions equal to float32: "
          f"kernels {share:.0%}, torch {torch_share:.0%}; fell back: {sorted(fallbacks(bf16))}")
    assert share >= torch_share - 0.25


def _share_before_divergence(got: list[list[int]], want: list[list[int]]) -> float:
    same = 0
    for a, b in zip(got, want, strict=True):
        same += next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
    return same / sum(len(b) for b in want)


def test_shapes_run_on_the_cpu_backend(kernels: CpuKernels, shape_dir: tuple[str, Path],
                                       caplog: pytest.LogCaptureFixture) -> None:
    name, path = shape_dir
    check_shape(kernels, name, path, lengths=(1, 19, 70), steps=8, caplog=caplog)


@pytest.mark.slow
def test_shapes_run_on_the_cpu_backend_long(kernels: CpuKernels, shape_dir: tuple[str, Path],
                                            caplog: pytest.LogCaptureFixture) -> None:
    """The long form: more prompts, longer contexts (several KV blocks, chunked prefill), more steps."""
    name, path = shape_dir
    check_shape(kernels, name, path, lengths=(1, 2, 17, 33, 150, 300, 511), steps=24, caplog=caplog)
