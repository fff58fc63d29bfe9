"""Write a random checkpoint of the real Qwen3-0.6B shape, with the real Qwen3 tokenizer.

Speed does not depend on weight values, so benchmarks run on this where real weights cannot be
downloaded:

    python scripts/make_random_model.py models/qwen3-0.6b-random            # bf16, ~1.2 GB
    python scripts/make_random_model.py /tmp/qwen3-4l --layers 4             # a quick smaller variant

The output is a Hugging Face model directory (config.json, generation_config.json,
model.safetensors, tokenizer.json, tokenizer_config.json) that `swiftlm serve DIR` accepts.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
import time
from pathlib import Path

import torch

from swiftlm.model.random_checkpoint import QWEN3_0_6B, write_random_checkpoint

TOKENIZER_ASSETS = Path(__file__).resolve().parent.parent / "tests" / "assets" / "qwen3_tokenizer"
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def write_tokenizer_files(dst: Path) -> None:
    """tokenizer.json (gunzipped from the test asset) and tokenizer_config.json."""
    with gzip.open(TOKENIZER_ASSETS / "tokenizer.json.gz", "rb") as src, open(dst / "tokenizer.json", "wb") as out:
        shutil.copyfileobj(src, out)
    shutil.copyfile(TOKENIZER_ASSETS / "tokenizer_config.json", dst / "tokenizer_config.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a random Qwen3-0.6B-shaped checkpoint.")
    parser.add_argument("out_dir", type=Path, help="directory to write (created if missing)")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="bfloat16", help="weight dtype (default: bfloat16)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument(
        "--layers",
        type=int,
        help=f"decoder layers (default: {QWEN3_0_6B['num_hidden_layers']}, the real model); fewer for a quick variant",
    )
    args = parser.parse_args(argv)
    if args.layers is not None and args.layers < 1:
        parser.error(f"--layers must be at least 1, got {args.layers}")

    overrides = {} if args.layers is None else {"num_hidden_layers": args.layers}
    start = time.perf_counter()
    write_random_checkpoint(args.out_dir, overrides, seed=args.seed, dtype=_DTYPES[args.dtype])
    write_tokenizer_files(args.out_dir)
    seconds = time.perf_counter() - start
    size = sum(f.stat().st_size for f in args.out_dir.iterdir() if f.is_file())
    weights = (args.out_dir / "model.safetensors").stat().st_size
    layers = args.layers or QWEN3_0_6B["num_hidden_layers"]
    print(
        f"wrote {args.out_dir}: {layers} layers, {args.dtype}, weights {weights / 2**30:.2f} GiB, "
        f"total {size / 2**30:.2f} GiB in {seconds:.1f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
