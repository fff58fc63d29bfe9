"""Write the real Qwen3 tokenizer files (a test asset) into a directory."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "qwen3_tokenizer"

# Qwen3-0.6B's generation_config.json, verbatim.
QWEN3_GENERATION_CONFIG: dict[str, Any] = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
}


def write_tokenizer_files(dst_dir: Path) -> None:
    """Write tokenizer.json (gunzipped) and tokenizer_config.json into dst_dir (created if missing)."""
    dst_dir = Path(dst_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    with (
        gzip.open(ASSET_DIR / "tokenizer.json.gz", "rb") as src,
        open(dst_dir / "tokenizer.json", "wb") as dst,
    ):
        shutil.copyfileobj(src, dst)
    shutil.copyfile(ASSET_DIR / "tokenizer_config.json", dst_dir / "tokenizer_config.json")


def write_generation_config(dst_dir: Path, config: dict[str, Any] | None = None) -> None:
    """Write generation_config.json (Qwen3's real one unless `config` is given) into dst_dir."""
    dst_dir = Path(dst_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    payload = QWEN3_GENERATION_CONFIG if config is None else config
    (dst_dir / "generation_config.json").write_text(json.dumps(payload, indent=2) + "\n")
