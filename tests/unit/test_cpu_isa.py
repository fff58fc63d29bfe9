"""``SWIFTLM_CPU_ISA=avx2``: an AVX-512 CPU run as an AVX2 one (its flags, the kernels' builds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from swiftlm.backends.cpu.kernels import build
from swiftlm.platform import CPU_ISA_ENV, cpu_flags, cpu_isa_override


def test_cpu_isa_avx2_masks_flags_and_builds(monkeypatch, tmp_path) -> None:
    real = cpu_flags()
    monkeypatch.setenv(CPU_ISA_ENV, "avx2")
    cpu_flags.cache_clear()
    try:
        masked = cpu_flags()
        assert cpu_isa_override() == "avx2"
        assert not any(f.startswith(("avx512", "amx")) for f in masked)
        assert masked == frozenset(f for f in real if not f.startswith(("avx512", "amx")))
        seen: list[tuple[str, ...]] = []

        def fake_load(name, sources, extra_cflags, **kwargs):
            seen.append(tuple(extra_cflags))
            raise RuntimeError("not built in this test")

        monkeypatch.setattr("torch.utils.cpp_extension.load", fake_load)
        monkeypatch.setattr(build, "cache_dir", lambda: tmp_path)
        with pytest.raises(RuntimeError, match="not built"):
            build.load_cpu_op_library("isa_probe", Path(build.__file__).with_name("common.h"))
        assert seen and all(flag in seen[0] for flag in build.AVX2_ONLY_CFLAGS)
        monkeypatch.setenv(CPU_ISA_ENV, "avx3")
        with pytest.raises(ValueError, match="expected 'native' or 'avx2'"):
            cpu_isa_override()
    finally:
        monkeypatch.delenv(CPU_ISA_ENV)
        cpu_flags.cache_clear()
    assert cpu_flags() == real

