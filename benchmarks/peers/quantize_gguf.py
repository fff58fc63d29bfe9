"""Quantize a GGUF file with llama.cpp's own quantizer, through llama-cpp-python's C API.

convert_hf_to_gguf.py writes f32 / f16 / bf16 / q8_0 (and tq1_0 / tq2_0) itself; Q4_0 and the
other llama.cpp types need `llama_model_quantize`. Run it with the Python that has llama_cpp
(the peers venv), not the project's:

    /work/peers-venv/bin/python benchmarks/peers/quantize_gguf.py IN-bf16.gguf OUT-q4_0.gguf q4_0

llama.cpp's default mix applies (as in its `llama-quantize` tool): a few tensors, such as the
output / token-embedding matrix, may be kept at a higher precision than the named type.
"""

from __future__ import annotations

import argparse
import ctypes
import sys


def main(argv: list[str] | None = None) -> int:
    import llama_cpp

    parser = argparse.ArgumentParser(description="Quantize a GGUF model with llama_model_quantize.")
    parser.add_argument("src", help="input GGUF (bf16, f16 or f32)")
    parser.add_argument("dst", help="output GGUF")
    parser.add_argument("type", help="llama.cpp type, e.g. q4_0, q8_0, q4_k_m (LLAMA_FTYPE_MOSTLY_<TYPE>)")
    parser.add_argument("--threads", type=int, default=2, help="quantizer threads (default: 2)")
    args = parser.parse_args(argv)

    name = f"LLAMA_FTYPE_MOSTLY_{args.type.upper()}"
    ftype = getattr(llama_cpp, name, None)
    if ftype is None:
        known = sorted(n.removeprefix("LLAMA_FTYPE_MOSTLY_").lower() for n in dir(llama_cpp) if n.startswith("LLAMA_FTYPE_MOSTLY_"))
        parser.error(f"unknown type {args.type!r}; llama_cpp {llama_cpp.__version__} knows: {', '.join(known)}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = args.threads
    rc = llama_cpp.llama_model_quantize(args.src.encode(), args.dst.encode(), ctypes.byref(params))
    if rc != 0:
        print(f"llama_model_quantize failed with code {rc}", file=sys.stderr)
        return 1
    print(f"wrote {args.dst} ({args.type})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
