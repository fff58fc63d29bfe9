"""CPU thread settings, applied before torch is imported (this module must not import it)."""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def physical_cores() -> int:
    """Distinct (package, core) pairs in /sys, i.e. cores without their SMT siblings."""
    cores = set()
    for topo in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology"):
        try:
            with open(f"{topo}/physical_package_id") as p, open(f"{topo}/core_id") as c:
                cores.add((p.read().strip(), c.read().strip()))
        except OSError:
            continue
    return len(cores) or (os.cpu_count() or 1)


def pin_cpu_threads_env() -> None:
    """Before torch loads OpenMP: one compute thread per physical core, each bound to its core
    (OMP_NUM_THREADS, OMP_PROC_BIND=close, OMP_PLACES=cores). Settings already in the
    environment win. Memory-bound decode gains nothing from SMT siblings, and threads that
    migrate between cores lose their caches."""
    if "torch" in sys.modules:
        return  # too late: OpenMP has read its environment
    os.environ.setdefault("OMP_NUM_THREADS", str(physical_cores()))
    os.environ.setdefault("OMP_PROC_BIND", "close")
    os.environ.setdefault("OMP_PLACES", "cores")


@contextmanager
def all_cpus() -> Iterator[None]:
    """Let the calling thread run on every CPU while the block runs, then restore its mask.

    A child process inherits the CPU mask of the thread that starts it. Once OpenMP has bound
    this process's main thread to one core (OMP_PROC_BIND), every process started from it would
    run all its threads on that core: a benchmark would measure its engines at half speed on 2
    cores. Start child processes inside this block.
    """
    get = getattr(os, "sched_getaffinity", None)
    if get is None:  # not Linux: no masks to inherit
        yield
        return
    saved = get(0)
    try:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))  # the kernel keeps only the allowed CPUs
    except OSError:
        saved = None
    try:
        yield
    finally:
        if saved is not None:
            os.sched_setaffinity(0, saved)
