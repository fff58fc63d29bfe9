"""Write a GGUF's tensors dequantised to F32 into a new GGUF (same metadata, same tensor names and
layout): llama.cpp then computes in float32 on exactly the weights swiftlm dequantises, so a
comparison of the two measures their arithmetic, not llama.cpp's quantised dot products.

    python scripts/gguf_to_f32.py IN.gguf OUT.gguf
"""

from __future__ import annotations

import argparse

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source")
    parser.add_argument("target")
    args = parser.parse_args()
    reader = GGUFReader(args.source)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(args.target, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue  # written by the writer itself
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            writer.add_array(field.name, field.contents())
        else:
            writer.add_key_value(field.name, field.contents(), kind)
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape))  # numpy order: ne reversed
        values = quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape).astype(np.float32)
        writer.add_tensor(tensor.name, values, raw_dtype=GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
