"""The AVX2 code paths on an AVX-512 CPU: the shape tests and the kernels' unit tests again, in a process
run as an AVX2 CPU (``SWIFTLM_CPU_ISA=avx2``, torch and oneDNN held to AVX2). Slow: every kernel is
built a second time, without AVX-512 (~2 minutes the first time, cached after)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from swiftlm.platform import CPU_ISA_ENV, cpu_flags

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_avx2_paths_pass_the_shape_and_kernel_tests() -> None:
    flags = cpu_flags()
    if "avx512f" not in flags:
        pytest.skip("this CPU has no AVX-512: its native paths are the AVX2 ones, tested everywhere")
    if not {"avx2", "fma", "f16c"} <= flags:
        pytest.skip("this CPU lacks AVX2, FMA or F16C")
    env = {**os.environ, CPU_ISA_ENV: "avx2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    tests = ["tests/model/test_shapes.py", "tests/unit/test_prefill_attention_kernel.py",
             "tests/unit/test_attention_kernel.py", "tests/unit/test_bf16_gemv_kernel.py"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *tests],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout.splitlines()[-1]
