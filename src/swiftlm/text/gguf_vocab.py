"""A tokenizer rebuilt from a GGUF file's ``tokenizer.ggml.*`` metadata (llama.cpp's key names).

Only byte-level BPE (``tokenizer.ggml.model == "gpt2"``: GPT-2, SmolLM, Qwen2/Qwen3, Llama 3) is
built; a SentencePiece vocabulary ("llama") is refused by name. The text is split the way the
vocabulary's merges were learned, chosen by ``tokenizer.ggml.pre`` as llama.cpp names it (its
``llama-vocab.cpp`` holds the same table). Token types: CONTROL (3) tokens become special added
tokens, USER_DEFINED (4) plain added tokens (matched whole, kept by decode).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

from swiftlm.core.gguf_file import GGUFError, GGUFFile

logger = logging.getLogger(__name__)

_CONTROL, _USER_DEFINED = 3, 4
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> (how text is split, whether a word found whole in the vocabulary skips the
# merges: Llama 3's tiktoken-style BPE, llama.cpp's ignore_merges)
_PRE_TOKENIZERS: dict[str, tuple[str, bool]] = {
    **{name: ("llama3", True) for name in ("llama-bpe", "llama3", "llama-v3", "falcon3", "smaug-bpe", "dbrx")},
    **{name: ("qwen2", False) for name in ("qwen2", "deepseek-r1-qwen", "megrez")},
    "smollm": ("smollm", False),
    "gpt-2": ("gpt2", False),
    "default": ("gpt2", False),
}


@dataclass(frozen=True, slots=True)
class GGUFVocab:
    """What ``Tokenizer`` takes, read from a GGUF file: the backend and the config dicts that
    tokenizer_config.json / generation_config.json would hold, and the chat template."""

    backend: tokenizers.Tokenizer
    tokenizer_config: dict[str, Any]
    generation_config: dict[str, Any]
    chat_template: str | None


def read_gguf_vocab(file: GGUFFile) -> GGUFVocab:
    kind = file.get("tokenizer.ggml.model")
    if kind != "gpt2":
        hint = " (SentencePiece vocabularies are not supported yet)" if kind == "llama" else ""
        raise GGUFError(f"{file.path}: tokenizer.ggml.model {kind!r} is not supported{hint}; swiftlm builds "
                        "byte-level BPE (\"gpt2\") tokenizers from GGUF metadata; put a tokenizer.json beside it")
    tokens: list[str] = file.get("tokenizer.ggml.tokens") or []
    merges: list[str] = file.get("tokenizer.ggml.merges") or []
    token_types: list[int] = file.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if not tokens or len(token_types) != len(tokens):
        raise GGUFError(f"{file.path}: tokenizer.ggml.tokens/token_type are missing or disagree in length")
    pre = file.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise GGUFError(f"{file.path}: pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported; "
                        f"known: {', '.join(sorted(_PRE_TOKENIZERS))}")
    split, ignore_merges = _PRE_TOKENIZERS[pre]
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)  # a repeated spelling keeps its first id, as llama.cpp's lookup does
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges,
                                              fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = _pre_tokenizer(split)
    backend.decoder = decoders.ByteLevel()
    added = [AddedToken(t, special=kind_ == _CONTROL, normalized=False)
             for t, kind_ in zip(tokens, token_types, strict=True) if kind_ in (_CONTROL, _USER_DEFINED)]
    backend.add_tokens([a for a in added if not a.special])
    backend.add_special_tokens([a for a in added if a.special])

    def token_at(key: str) -> tuple[int | None, str | None]:
        index = file.get(f"tokenizer.ggml.{key}")
        return (int(index), tokens[int(index)]) if index is not None and 0 <= int(index) < len(tokens) else (None, None)

    bos_id, bos = token_at("bos_token_id")
    eos_id, eos = token_at("eos_token_id")
    pad_id, pad = token_at("padding_token_id")
    add_bos = bool(file.get("tokenizer.ggml.add_bos_token", False))
    if add_bos and bos_id is not None:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1", special_tokens=[(bos, bos_id)])
    # llama.cpp ends generation at any end-of-generation token: eos, and eot / eom where given
    stop_ids = [eos_id] + [token_at(k)[0] for k in ("eot_token_id", "eom_token_id")]
    config = {"bos_token": bos, "eos_token": eos, "pad_token": pad, "add_bos_token": add_bos,
              "unk_token": token_at("unknown_token_id")[1]}
    generation = {"eos_token_id": list(dict.fromkeys(i for i in stop_ids if i is not None))}
    if bos_id is not None:
        generation["bos_token_id"] = bos_id
    if pad_id is not None:
        generation["pad_token_id"] = pad_id
    return GGUFVocab(backend, config, generation, file.get("tokenizer.chat_template"))


def _pre_tokenizer(split: str) -> pre_tokenizers.PreTokenizer:
    if split == "gpt2":  # GPT-2's own regex, inside ByteLevel
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if split == "smollm":  # every digit on its own, then GPT-2's regex (SmolLM's tokenizer.json, llama.cpp's smollm)
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    pattern = _LLAMA3_SPLIT if split == "llama3" else _QWEN2_SPLIT
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
