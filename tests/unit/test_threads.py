"""Thread settings are placed in the environment before torch loads OpenMP, without overriding the user's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from swiftlm.threads import physical_cores

PROBE = (
    "import json, os, sys; from swiftlm.threads import pin_cpu_threads_env; pin_cpu_threads_env(); "
    "import torch; print(json.dumps([os.environ.get(k) for k in ('OMP_NUM_THREADS', 'OMP_PROC_BIND', "
    "'OMP_PLACES')] + [torch.get_num_threads()]))"
)


def _run(env: dict[str, str]) -> list:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_physical_cores_counts_cores_not_siblings() -> None:
    n = physical_cores()
    assert 1 <= n <= (os.cpu_count() or 1)


def test_defaults_bind_one_thread_per_core() -> None:
    n = physical_cores()
    assert _run({}) == [str(n), "close", "cores", n]


def test_user_settings_win() -> None:
    assert _run({"OMP_NUM_THREADS": "1", "OMP_PROC_BIND": "false"}) == ["1", "false", "cores", 1]
