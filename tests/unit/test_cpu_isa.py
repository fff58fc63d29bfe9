"""What the machine's instruction sets choose: ``--dtype auto`` on the CPU backend, and
``SWIFTLM_CPU_ISA=avx2`` (an AVX-512 CPU run as an AVX2 one: its flags, the kernels' builds)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swiftlm.backends.cpu import backend as cpu_backend
from swiftlm.backends.cpu.backend import CpuBackend
from swiftlm.backends.cpu.kernels import build
from swiftlm.backends.cpu.ops import CpuKernels
from swiftlm.backends.torch import TorchBackend
from swiftlm.platform import CPU_ISA_ENV, cpu_flags, cpu_isa_override


def gemv_stub(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w.T


def build_flags_under(monkeypatch, tmp_path) -> tuple[str, ...]:
    """The compiler flags a kernel build gets under the current environment (the build itself faked)."""
    seen: list[tuple[str, ...]] = []

    def fake_load(name, sources, extra_cflags, **kwargs):
        seen.append(tuple(extra_cflags))
        raise RuntimeError("not built in this test")

    monkeypatch.setattr("torch.utils.cpp_extension.load", fake_load)
    monkeypatch.setattr(build, "cache_dir", lambda: tmp_path)
    with pytest.raises(RuntimeError, match="not built"):
        build.load_cpu_op_library("isa_probe", Path(build.__file__).with_name("common.h"))
    return seen[0]


@pytest.mark.parametrize(
    ("native_bf16", "gemv", "expected"),
    [(True, True, "bfloat16"), (True, False, "bfloat16"),  # native bf16: as platform.resolve_dtype
     (False, True, "bfloat16"),  # AVX2: the bf16 kernels read half the bytes of float32
     (False, False, "float32")],  # no kernel (no compiler, no AVX2): torch's bf16 is slow there
)
def test_auto_dtype_on_the_cpu_backend(monkeypatch, native_bf16, gemv, expected) -> None:
    monkeypatch.setattr(cpu_backend, "cpu_has_bf16", lambda: native_bf16)
    monkeypatch.setattr("swiftlm.platform.cpu_has_bf16", lambda: native_bf16)
    backend = CpuBackend(kernels=CpuKernels(gemv=gemv_stub if gemv else None))
    assert backend.resolve_dtype("auto") == expected
    assert backend.resolve_dtype("float32") == "float32"
    assert backend.resolve_dtype("bfloat16") == "bfloat16"
    assert TorchBackend("cpu").resolve_dtype("auto") == ("bfloat16" if native_bf16 else "float32")


def test_cpu_isa_avx2_masks_flags_and_builds(monkeypatch, tmp_path) -> None:
    real = cpu_flags()
    monkeypatch.setenv(CPU_ISA_ENV, "avx2")
    cpu_flags.cache_clear()
    try:
        masked = cpu_flags()
        assert cpu_isa_override() == "avx2"
        assert not any(f.startswith(("avx512", "amx")) for f in masked)
        assert masked == frozenset(f for f in real if not f.startswith(("avx512", "amx")))
        assert all(flag in build_flags_under(monkeypatch, tmp_path) for flag in build.AVX2_ONLY_CFLAGS)
        monkeypatch.setenv(CPU_ISA_ENV, "avx3")
        with pytest.raises(ValueError, match="expected 'native', 'avx512' or 'avx2'"):
            cpu_isa_override()
    finally:
        monkeypatch.delenv(CPU_ISA_ENV)
        cpu_flags.cache_clear()
    assert cpu_flags() == real



def test_cpu_isa_avx512_masks_amx_only(monkeypatch, tmp_path) -> None:
    """An AMX CPU run as an AVX-512 one without AMX: the flags lose amx_* alone, the builds AMX alone."""
    real = cpu_flags()
    monkeypatch.setenv(CPU_ISA_ENV, "avx512")
    cpu_flags.cache_clear()
    try:
        masked = cpu_flags()
        assert masked == frozenset(f for f in real if not f.startswith("amx"))
        flags = build_flags_under(monkeypatch, tmp_path)
        assert all(flag in flags for flag in build.NO_AMX_CFLAGS) and "-mno-avx512f" not in flags
    finally:
        monkeypatch.delenv(CPU_ISA_ENV)
        cpu_flags.cache_clear()
    assert cpu_flags() == real
