"""Thread settings are placed in the environment before torch loads OpenMP, without overriding the user's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from swiftlm.threads import all_cpus, physical_cores

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


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or (os.cpu_count() or 1) < 2, reason="needs CPU masks and 2 CPUs")
def test_children_started_under_all_cpus_are_not_bound_to_the_parents_core() -> None:
    """A child inherits the mask of the thread that starts it; all_cpus lifts it for the start only."""
    script = "import os; print(len(os.sched_getaffinity(0)))"
    allowed = len(os.sched_getaffinity(0))
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(saved)})  # what OpenMP's binding does to a main thread
    try:
        bound = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
        with all_cpus():
            free = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
        assert os.sched_getaffinity(0) == {min(saved)}  # restored afterwards
    finally:
        os.sched_setaffinity(0, saved)
    assert int(bound.stdout) == 1
    assert int(free.stdout) == allowed
