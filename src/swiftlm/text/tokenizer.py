"""The model's tokenizer: a `tokenizers.Tokenizer` plus what tokenizer_config.json and
generation_config.json say about special tokens, the chat template and sampling defaults."""

from __future__ import annotations

import copy
import gzip
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers

from swiftlm.core.gguf_file import GGUFFile
from swiftlm.text.chat_template import ChatTemplate, ChatTemplateError
from swiftlm.text.gguf_vocab import read_gguf_vocab

# Sampling fields of generation_config.json that serve as request defaults.
_GENERATION_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "do_sample")


def _read_json(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _token_content(value: Any) -> str | None:
    """tokenizer_config.json writes a special token as a string or as {"content": ...}."""
    if isinstance(value, Mapping):
        return value.get("content")
    return value


def _select_chat_template(value: Any) -> str | None:
    """A template string, or the "default" one of a list of {"name", "template"} entries."""
    if value is None or isinstance(value, str):
        return value
    named = {entry["name"]: entry["template"] for entry in value}
    return named.get("default")


def _load_backend(model_dir: Path) -> tokenizers.Tokenizer:
    plain = model_dir / "tokenizer.json"
    if plain.is_file():
        return tokenizers.Tokenizer.from_file(str(plain))
    packed = model_dir / "tokenizer.json.gz"
    if packed.is_file():
        return tokenizers.Tokenizer.from_str(gzip.decompress(packed.read_bytes()).decode("utf-8"))
    raise FileNotFoundError(f"no tokenizer.json (or tokenizer.json.gz) in {model_dir}")


class Tokenizer:
    """Text <-> token ids for one model. Read-only after construction."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        tokenizer_config: Mapping[str, Any] | None = None,
        generation_config: Mapping[str, Any] | None = None,
        chat_template: str | None = None,
    ) -> None:
        config = dict(tokenizer_config or {})
        gen_config = dict(generation_config or {})
        self._backend = backend
        self._special_strings = {
            name: _token_content(config.get(name))
            for name in ("bos_token", "eos_token", "pad_token", "unk_token")
        }
        self._eos_token_id = self.token_id(self._special_strings["eos_token"] or "")
        pad_id = self.token_id(self._special_strings["pad_token"] or "")
        self._pad_token_id = pad_id if pad_id is not None else gen_config.get("pad_token_id")

        gen_eos = gen_config.get("eos_token_id")
        eos_ids = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        if self._eos_token_id is not None and self._eos_token_id not in eos_ids:
            eos_ids.append(self._eos_token_id)
        self._eos_token_ids = tuple(eos_ids)

        added = backend.get_added_tokens_decoder()
        self._special_token_ids = frozenset(i for i, tok in added.items() if tok.special)
        self._generation_defaults = {k: gen_config[k] for k in _GENERATION_DEFAULT_KEYS if k in gen_config}

        template = (
            chat_template if chat_template is not None else _select_chat_template(config.get("chat_template"))
        )
        self._chat_template = ChatTemplate(template, self._special_strings) if template else None
        self._think_start_id = self.token_id("<think>")
        self._think_end_id = self.token_id("</think>")

    @classmethod
    def from_dir(cls, model_dir: str | Path, chat_template: str | None = None) -> Tokenizer:
        """Load tokenizer.json (or tokenizer.json.gz), tokenizer_config.json and, if present,
        generation_config.json and chat_template.jinja from a model directory. ``chat_template``
        (Jinja source, e.g. from ``--chat-template``) replaces the model's own template."""
        model_dir = Path(model_dir)
        backend = _load_backend(model_dir)
        config_path = model_dir / "tokenizer_config.json"
        config = _read_json(config_path) if config_path.is_file() else {}
        gen_path = model_dir / "generation_config.json"
        gen_config = _read_json(gen_path) if gen_path.is_file() else {}
        template = chat_template
        if template is None and config.get("chat_template") is None and (model_dir / "chat_template.jinja").is_file():
            template = (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
        return cls(backend, config, gen_config, template)

    @classmethod
    def from_gguf(cls, file: GGUFFile | str | Path, chat_template: str | None = None) -> Tokenizer:
        """The tokenizer a GGUF file's metadata describes (``tokenizer.ggml.*``, ``tokenizer.chat_template``);
        for a file with tokenizer files beside it, ``from_dir`` of that directory is the one to use."""
        vocab = read_gguf_vocab(file if isinstance(file, GGUFFile) else GGUFFile(file))
        template = chat_template if chat_template is not None else vocab.chat_template
        return cls(vocab.backend, vocab.tokenizer_config, vocab.generation_config, template)

    # -- encoding and decoding -------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`. Qwen3 adds no BOS, so add_special_tokens changes nothing for it."""
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; invalid UTF-8 byte sequences decode to U+FFFD."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str | None]:
        """The vocabulary strings of `ids` (byte-level for BPE tokens); None for unknown ids."""
        return [self._backend.id_to_token(i) for i in ids]

    def token_id(self, token: str) -> int | None:
        """The id of one vocabulary entry (e.g. "<think>"), or None if it is not in the vocabulary."""
        return self._backend.token_to_id(token) if token else None

    # -- properties ------------------------------------------------------------------------------

    @property
    def backend(self) -> tokenizers.Tokenizer:
        return self._backend

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included (the model's embedding may be larger)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_id(self) -> int | None:
        return self._eos_token_id

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Ids that end generation: generation_config.json's eos_token_id plus the tokenizer's eos."""
        return self._eos_token_ids

    @property
    def pad_token_id(self) -> int | None:
        return self._pad_token_id

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Added tokens marked special (removed by decode with skip_special_tokens=True)."""
        return self._special_token_ids

    @property
    def think_start_id(self) -> int | None:
        return self._think_start_id

    @property
    def think_end_id(self) -> int | None:
        return self._think_end_id

    @property
    def chat_template(self) -> str | None:
        return self._chat_template.source if self._chat_template is not None else None

    def with_generation_defaults(self, overrides: Mapping[str, Any]) -> Tokenizer:
        """A copy whose sampling defaults are ``overrides`` over the checkpoint's (vLLM's
        --override-generation-config); raises ValueError for a key that is not a sampling default."""
        unknown = set(overrides) - set(_GENERATION_DEFAULT_KEYS)
        if unknown:
            raise ValueError(f"generation config overrides {sorted(unknown)} are not sampling defaults; "
                             f"use {', '.join(_GENERATION_DEFAULT_KEYS)}")
        other = copy.copy(self)
        other._generation_defaults = {**self._generation_defaults, **overrides}
        return other

    @property
    def generation_defaults(self) -> dict[str, Any]:
        """Sampling defaults from generation_config.json (a fresh dict; empty without that file)."""
        return dict(self._generation_defaults)

    # -- chat ------------------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: Sequence[Any],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text for a conversation (see chat_template.py for accepted message shapes)."""
        if self._chat_template is None:
            raise ChatTemplateError(
                "this tokenizer has no chat template; send a plain prompt instead of messages"
            )
        return self._chat_template.render(
            messages, add_generation_prompt=add_generation_prompt, tools=tools, **template_kwargs
        )
