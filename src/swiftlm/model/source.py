"""Where a model comes from: the one place that turns the ``model`` argument into what to load.

``model`` may be a Hugging Face model directory (config.json + safetensors), a hub id (its
snapshot downloaded, or found in the cache with HF_HUB_OFFLINE=1), a ``.gguf`` file, a directory
holding exactly one ``.gguf`` (and no config.json), a hub id with ``gguf_file`` naming a file in
that repo, or ``repo:QUANT`` (``bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M``: the repo's one
GGUF whose name carries that quantisation). ``Engine``, ``PlainLLM`` and ``LLM`` all go through
``resolve_model``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from swiftlm.core.gguf_file import GGUFFile

_HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.json.gz")
_SHARD = re.compile(r"-\d{5}-of-\d{5}\.gguf$")


class LoadError(ValueError):
    """A checkpoint that cannot be loaded, with a message that names what is wrong."""


@dataclass(frozen=True, slots=True)
class ModelSource:
    """What to load: ``directory`` (a Hugging Face model directory, or the one a GGUF file sits in)
    and, for a GGUF checkpoint, the opened file (parsed once, shared by the weights and tokenizer)."""

    directory: Path
    gguf: GGUFFile | None = None

    @property
    def tokenizer_in_directory(self) -> bool:
        """Whether the tokenizer comes from files in ``directory`` (always for safetensors; for a
        GGUF only when tokenizer.json sits beside it, else from the file's own metadata)."""
        return self.gguf is None or any((self.directory / n).is_file() for n in _TOKENIZER_FILES)


def resolve_model(model: str | Path, gguf_file: str | None = None) -> ModelSource:
    """The checkpoint ``model`` (and ``gguf_file``, a file name inside a hub repo or directory) names."""
    path = Path(model).expanduser()
    if gguf_file is not None:
        if path.is_dir():
            return _gguf_source(path / gguf_file)
        return _gguf_source(_hub_download(str(model), gguf_file))
    if path.is_file():
        return _gguf_source(path)
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource(path)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return _gguf_source(ggufs[0])
        if ggufs:
            raise LoadError(f"{path} holds {len(ggufs)} .gguf files ({', '.join(g.name for g in ggufs)}); "
                            "name one (a path to it, or --gguf-file NAME)")
        raise LoadError(f"{path} has no config.json (a Hugging Face model directory) and no .gguf file")
    looks_local = str(model).startswith((".", "/", "~")) or str(model).count("/") > 1
    repo, _, quant = str(model).partition(":")
    if quant and not looks_local and repo.count("/") == 1:
        return _gguf_source(_hub_download(repo, _pick_quant_file(repo, quant)))
    if path.exists() or looks_local:
        raise LoadError(f"model path {model} is neither a directory nor a .gguf file")
    return _hub_snapshot(str(model))


def _gguf_source(path: Path) -> ModelSource:
    if not path.is_file():
        raise LoadError(f"GGUF file {path} does not exist")
    if path.suffix != ".gguf":
        raise LoadError(f"{path} is a file but not a .gguf; give a model directory, a .gguf file or a hub id")
    return ModelSource(path.parent, GGUFFile(path))


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def _hub_errors() -> tuple[type[Exception], ...]:
    from huggingface_hub.errors import EntryNotFoundError, HFValidationError, LocalEntryNotFoundError

    return LocalEntryNotFoundError, EntryNotFoundError, HFValidationError


def _hub_failure(what: str, exc: Exception) -> LoadError:
    from huggingface_hub.errors import HFValidationError

    if isinstance(exc, HFValidationError):
        return LoadError(f"{what} is neither a local directory, a .gguf file nor a valid hub id: {exc}")
    hint = " (HF_HUB_OFFLINE is set and it is not in the local cache)" if _offline() else ""
    return LoadError(f"could not find {what} on the Hugging Face hub{hint}: {exc}")


def _hub_snapshot(repo: str) -> ModelSource:
    from huggingface_hub import snapshot_download

    try:
        # snapshot_download shows a tqdm progress bar per file and honours HF_HUB_OFFLINE itself.
        local = Path(snapshot_download(repo_id=repo, allow_patterns=_HUB_FILES))
    except _hub_errors() as exc:
        raise _hub_failure(f"model {repo!r}", exc) from exc
    if not (local / "config.json").is_file():
        raise LoadError(f"hub repo {repo!r} has no config.json; for a GGUF repo give --gguf-file NAME or "
                        f"{repo}:QUANT (e.g. {repo}:Q4_K_M)")
    return ModelSource(local)


def _hub_download(repo: str, filename: str) -> Path:
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id=repo, filename=filename))
    except _hub_errors() as exc:
        raise _hub_failure(f"{filename!r} in {repo!r}", exc) from exc


def _hub_gguf_names(repo: str) -> list[str]:
    """The .gguf files of ``repo``: listed by the hub, or, offline, those in the cached snapshot."""
    if _offline():
        from huggingface_hub import snapshot_download

        try:
            snapshot = Path(snapshot_download(repo_id=repo, allow_patterns=["*.gguf"]))
        except _hub_errors() as exc:
            raise _hub_failure(f"repo {repo!r}", exc) from exc
        return sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*.gguf"))
    from huggingface_hub import list_repo_files

    try:
        return sorted(n for n in list_repo_files(repo) if n.endswith(".gguf"))
    except _hub_errors() as exc:
        raise _hub_failure(f"repo {repo!r}", exc) from exc


def _pick_quant_file(repo: str, quant: str) -> str:
    """The one GGUF of ``repo`` whose name carries ``quant`` as a whole word (Q4_K_M is not Q4_K_S)."""
    names = _hub_gguf_names(repo)
    word = re.compile(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9])", re.IGNORECASE)
    matches = [n for n in names if word.search(Path(n).stem)]
    if len(matches) == 1:
        if _SHARD.search(matches[0]):
            raise LoadError(f"{repo}:{quant} is a split GGUF ({matches[0]}); merge it first (gguf-split --merge)")
        return matches[0]
    available = ", ".join(names) or "none"
    if not matches:
        raise LoadError(f"hub repo {repo!r} has no .gguf file for quantisation {quant!r}; its files: {available}")
    raise LoadError(f"{repo}:{quant} matches {len(matches)} files ({', '.join(matches)}); "
                    "name one with --gguf-file NAME")
