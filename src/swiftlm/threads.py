"""CPU thread settings, applied before torch is imported (this module must not import it)."""

from __future__ import annotations

import glob
import os
import sys


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
