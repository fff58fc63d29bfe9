"""The Python heap's collector, set for an engine loop (interpreter state, set once per process).

A decode step of 256 sequences allocates ~1,000 small container objects (scheduled entries,
sampling rows, sampled tokens) that die within the step. With the interpreter's defaults (a
young-generation collection every 700 allocations) the collector walks them one or two times a
step, and every ~100 young collections it may walk the whole heap: ~180,000 objects once torch and
the server's libraries are imported, ~0.1-0.2 s on a 2-core VM, a stall in the middle of a step.

``settle_heap`` (called when an engine is built) does what long-running servers do:

- ``gc.freeze()`` once per process, after a full collection: what exists then (imported modules,
  the first engine's model and tokenizer) moves to a permanent generation that no collection walks;
- the young generation's threshold is raised to ``YOUNG_THRESHOLD`` allocations, so the objects of
  a step are mostly freed by their reference counts before a collection would walk them.

Cycles still get collected, only less often; the memory they hold meanwhile is a few thousand
small objects. At exit the heap is unfrozen, so that finalisation collects it as usual (native
bindings such as Triton's report objects still alive then as leaks).
"""

from __future__ import annotations

import atexit
import gc

YOUNG_THRESHOLD = 20_000  # allocations between young-generation collections (the default is 700)


def settle_heap() -> None:
    """Freeze the heap as it is (first call in a process only) and raise the young threshold."""
    if gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()
        atexit.register(gc.unfreeze)  # at exit the frozen objects are the collector's again (bindings check for leaks)
    young, middle, old = gc.get_threshold()
    if 0 < young < YOUNG_THRESHOLD:  # 0: the collector is off; leave a caller's choice alone
        gc.set_threshold(YOUNG_THRESHOLD, middle, old)
