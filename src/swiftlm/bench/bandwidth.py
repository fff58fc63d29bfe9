"""Memory read bandwidth, measured in-process, to state how close a run came to the hardware bound.

The machines we benchmark on change bandwidth by up to 1.6x from one minute to the next, so
every timed segment is bracketed by a probe and results are reported as fractions of it.
"""

from __future__ import annotations

import time

import torch

from swiftlm.backends.cpu.host_memory import huge_page_buffer

_PROBE_BYTES = 1 << 30  # twice the largest L3 seen (480 MiB): the probe must not be served from cache


class BandwidthProbe:
    """Reads a buffer much larger than the caches; reports the best of a few passes in GB/s.

    The buffer is on huge pages (``swiftlm.backends.cpu.host_memory``), as the engine's weights and KV cache
    are: on 4 KiB pages the same read can be ~2x slower on a VM (TLB misses), which would state
    a bound lower than what the hardware streams.
    """

    def __init__(self, nbytes: int = _PROBE_BYTES) -> None:
        self._buf = huge_page_buffer(nbytes // 4 * 4).view(torch.float32)
        self._buf.fill_(1.0)

    def measure(self, passes: int = 5) -> float:
        best = float("inf")
        for _ in range(passes):
            t0 = time.perf_counter()
            self._buf.sum()
            best = min(best, time.perf_counter() - t0)
        return self._buf.numel() * 4 / best / 1e9
