"""`python -m llama_cpp.server`, optionally with llama.cpp's extra buffer types turned off.

    /work/peers-venv/bin/python benchmarks/peers/llama_server.py --no-extra-bufts --model X.gguf ...

Why: on CPUs with AMX (this machine's Xeon has amx_int8 / amx_tile), llama.cpp puts quantized
weights (Q4_0, Q8_0, ...) into its AMX buffer type, and the first decode then segfaults in
ggml_backend_amx_mul_mat (llama.cpp issue #20824, still open). BF16 weights do not use AMX and
run fine. llama-cpp-python 0.3.x has no flag for llama.cpp's `--no-repack` / `use_extra_bufts`,
so `--no-extra-bufts` sets it in `llama_model_default_params` before the server loads the model.
It turns off the AMX buffers and llama.cpp's CPU repacking (interleaved Q4_0 / Q8_0 layouts) with
them, so quantized numbers run this way understate a llama.cpp build without AMX
(CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON ..." without the AMX options; see README.md).
Every other argument goes to llama_cpp.server unchanged.
"""

from __future__ import annotations

import sys


def disable_extra_bufts() -> None:
    """Make every model load with llama.cpp's extra buffer types off (see above); call before loading."""
    import llama_cpp.llama_cpp as lib

    default_params = lib.llama_model_default_params

    def without_extra_bufts() -> object:
        params = default_params()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = without_extra_bufts


def main() -> None:
    argv = sys.argv[1:]
    if "--no-extra-bufts" in argv:
        argv.remove("--no-extra-bufts")
        disable_extra_bufts()
    from llama_cpp.server.__main__ import main as server_main

    sys.argv = [sys.argv[0], *argv]
    server_main()


if __name__ == "__main__":
    main()
