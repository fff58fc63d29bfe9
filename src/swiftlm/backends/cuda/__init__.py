"""The CUDA backend: KV pools on the device, attention and the KV store as Triton kernels
(``kernels/``), CUDA graphs for decode-only steps (``graphs.py``). Importing this package imports
neither triton nor CUDA; ``backend.py`` does, when ``build_backend`` picks it for ``cuda[:N]``."""
