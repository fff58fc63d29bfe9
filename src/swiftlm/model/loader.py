"""Load a checkpoint (safetensors or GGUF, found by ``swiftlm.model.source``) into the decoder."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors import safe_open

from swiftlm.config import ConfigError, ModelConfig
from swiftlm.core.gguf_file import GGUFFile
from swiftlm.model.assemble import assemble_model
from swiftlm.model.decoder import DecoderForCausalLM, expected_tensor_shapes
from swiftlm.model.gguf_checkpoint import load_gguf_model
from swiftlm.model.source import LoadError, ModelSource, resolve_model
from swiftlm.text.tokenizer import Tokenizer

__all__ = ["LoadError", "ModelSource", "load_model", "load_tokenizer", "parse_dtype", "resolve_model",
           "resolve_model_dir"]

logger = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in _DTYPES:
        raise ConfigError(f"dtype {name!r} is not supported; use one of float32, bfloat16, float16")
    return _DTYPES[name]


def resolve_model_dir(model: str | Path) -> Path:
    """The directory ``model`` resolves to (see ``resolve_model``, which also says whether it is a GGUF)."""
    return resolve_model(model).directory


def load_tokenizer(source: ModelSource, chat_template: str | None = None) -> Tokenizer:
    """The source's tokenizer: its directory's tokenizer files, or a GGUF file's own metadata."""
    if source.gguf is not None and not source.tokenizer_in_directory:
        return Tokenizer.from_gguf(source.gguf, chat_template)
    return Tokenizer.from_dir(source.directory, chat_template)


def _safetensors_files(model_dir: Path) -> list[Path]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise LoadError(f"{model_dir} holds no *.safetensors weights")
    return files


def load_model(
    model_dir: str | Path | ModelSource,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    config: ModelConfig | None = None,
) -> DecoderForCausalLM:
    """Build the model for ``model_dir`` (a directory, a .gguf file or a resolved ``ModelSource``)
    and fill it from its safetensors files or its GGUF file (``gguf_checkpoint``: dequantised).

    The model is built on the meta device and the loaded tensors are assigned to it directly, so
    weights whose dtype already matches are used from the memory-mapped file without a copy.
    """
    if isinstance(model_dir, ModelSource):
        if model_dir.gguf is not None:
            return load_gguf_model(model_dir.gguf, parse_dtype(dtype), device, config)
        model_dir = model_dir.directory
    if str(model_dir).endswith(".gguf"):
        return load_gguf_model(GGUFFile(model_dir), parse_dtype(dtype), device, config)
    model_dir = Path(model_dir)
    config = config or ModelConfig.from_model_dir(model_dir)
    torch_dtype = parse_dtype(dtype)
    expected = expected_tensor_shapes(config)
    state: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    for file in _safetensors_files(model_dir):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                if name not in expected:
                    if config.tie_word_embeddings and name == "lm_head.weight":
                        continue  # some tied checkpoints still store the head; the embedding wins
                    unexpected.append(name)
                    continue
                state[name] = f.get_tensor(name)
    missing = [n for n in expected if n not in state]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensors: {_names(missing)}")
        if unexpected:
            parts.append(f"unexpected tensors: {_names(unexpected)}")
        raise LoadError(f"checkpoint in {model_dir} does not match its config.json: " + "; ".join(parts))
    for name, tensor in state.items():
        if tuple(tensor.shape) != expected[name]:
            raise LoadError(
                f"tensor {name} has shape {tuple(tensor.shape)} in the checkpoint but the config "
                f"expects {expected[name]}"
            )
    return assemble_model(config, {n: t.to(device=device, dtype=torch_dtype) for n, t in state.items()}, device)


def _names(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
