"""``settle_heap``: the heap frozen once per process, the young generation's threshold raised, a
collector turned off left off."""

from __future__ import annotations

import gc
import subprocess
import sys

CHECK = """
import gc
from swiftlm.engine.heap import YOUNG_THRESHOLD, settle_heap
assert gc.get_freeze_count() == 0
settle_heap()
frozen = gc.get_freeze_count()
assert frozen > 0 and gc.get_threshold()[0] == YOUNG_THRESHOLD, (frozen, gc.get_threshold())
junk = [[i] for i in range(1000)]  # new objects: a second call freezes nothing more
settle_heap()
assert gc.get_freeze_count() == frozen
gc.set_threshold(0)
settle_heap()
assert gc.get_threshold()[0] == 0
print("ok")
"""


def test_heap_is_frozen_once_and_the_young_threshold_raised() -> None:
    # a fresh interpreter: the test process's own collector state is not this test's to change
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert gc.isenabled()
