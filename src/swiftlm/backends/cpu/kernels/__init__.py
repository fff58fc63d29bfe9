"""Hand-written CPU kernels, compiled on first use as torch C++ extensions.

Each kernel has a loader that returns ``None`` when it cannot be used (no compiler, build error,
missing CPU features); callers then keep their plain torch path, which is also the test oracle.
"""
