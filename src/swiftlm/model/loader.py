"""Find a checkpoint (local directory or Hugging Face hub id) and load it into the decoder."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from safetensors import safe_open

from swiftlm.config import ConfigError, ModelConfig
from swiftlm.model.decoder import DecoderForCausalLM, expected_tensor_shapes

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
_HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]


class LoadError(ValueError):
    """A checkpoint that cannot be loaded, with a message that names what is wrong."""


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in _DTYPES:
        raise ConfigError(f"dtype {name!r} is not supported; use one of float32, bfloat16, float16")
    return _DTYPES[name]


def resolve_model_dir(model: str | Path) -> Path:
    """A local directory as is; otherwise a hub id, downloaded (or found in the cache offline)."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise LoadError(f"{path} has no config.json; is it a Hugging Face model directory?")
        return path
    if path.exists() or str(model).startswith((".", "/", "~")) or str(model).count("/") > 1:
        raise LoadError(f"model path {model} is not a directory")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    try:
        # snapshot_download shows a tqdm progress bar per file and honours HF_HUB_OFFLINE itself.
        local = snapshot_download(repo_id=str(model), allow_patterns=_HUB_FILES)
    except LocalEntryNotFoundError as exc:
        hint = " (HF_HUB_OFFLINE is set and it is not in the local cache)" if offline else ""
        raise LoadError(f"could not find model {model!r} on the Hugging Face hub{hint}: {exc}") from exc
    except HFValidationError as exc:
        raise LoadError(f"{model!r} is neither a local directory nor a valid hub id: {exc}") from exc
    return resolve_model_dir(local)


def _safetensors_files(model_dir: Path) -> list[Path]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise LoadError(f"{model_dir} holds no *.safetensors weights")
    return files


def load_model(
    model_dir: str | Path,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    config: ModelConfig | None = None,
) -> DecoderForCausalLM:
    """Build the model for ``model_dir`` and fill it from its safetensors files.

    The model is built on the meta device and the loaded tensors are assigned to it directly, so
    weights whose dtype already matches are used from the memory-mapped file without a copy.
    """
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
    with torch.device("meta"):
        model = DecoderForCausalLM(config)
    converted = {n: t.to(device=device, dtype=torch_dtype) for n, t in state.items()}
    model.load_state_dict(converted, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # Buffers (rotary tables) are computed, not loaded: rebuild them on the real device.
    rotary = type(model.model.rotary)(config.head_dim, config.max_position_embeddings, config.rope_theta,
                                      config.rope_scaling)
    model.model.rotary = rotary.to(device)
    model.eval().requires_grad_(False)
    return model


def _names(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
