"""Shared fixtures: tiny random Qwen3 checkpoints with the real Qwen3 tokenizer.

The *scripted* checkpoint answers deterministically: attention and MLP outputs are zeroed, so
the next token depends only on the current one, and the lm_head maps a chain of tokens

    "\\n" -> <think> -> "Hmm" -> "," -> " okay" -> </think> -> "\\n\\n" -> "Hello" -> " there" -> "!" -> <|im_end|>

A thinking prompt (ends in "assistant\\n") yields "<think>Hmm, okay</think>\\n\\nHello there!";
a non-thinking prompt (ends in "</think>\\n\\n") yields "Hello there!".
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import tokenizers
import torch
from safetensors.torch import load_file, save_file

import swiftlm.text.tokenizer
from swiftlm.model.random_checkpoint import write_random_checkpoint
from tests.helpers.tokenizer_files import write_tokenizer_files

TINY_TIED = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}
TINY_UNTIED = {
    "hidden_size": 96,
    "intermediate_size": 192,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 3,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


# the other architectures, with odd head counts: Llama with Llama 3 rotary scaling and a tied head
# (shaped for the CPU kernels: widths multiples of 32), Qwen2 with its q/k/v biases, an untied head
# and widths the kernels do not take (they fall back)
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 96,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 3,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "rope_theta": 100000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 64},
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}
TINY_QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 120,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 5,
    "num_key_value_heads": 1,
    "head_dim": 24,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
}


@pytest.fixture(scope="session", autouse=True)
def _parsed_tokenizer_json_kept() -> Iterator[None]:
    """Every engine, LLM and server a test builds parses its model's tokenizer.json (the same 11 MB
    Qwen3 file in nearly every test: ~1 s of CPU each time, hundreds of times a run). Within a
    session a file of the same content is parsed once and its ``tokenizers.Tokenizer`` (immutable:
    swiftlm only encodes and decodes with it) handed to every later ``Tokenizer.from_dir``; the rest
    of the loading (configs, chat template, special tokens) runs each time. A file of other content
    is parsed afresh."""
    parsed: dict[str, tokenizers.Tokenizer] = {}
    load = swiftlm.text.tokenizer._load_backend

    def load_once(model_dir: Path) -> tokenizers.Tokenizer:
        plain = Path(model_dir) / "tokenizer.json"
        if not plain.is_file():
            return load(model_dir)  # tokenizer.json.gz, or the error
        key = hashlib.sha256(plain.read_bytes()).hexdigest()
        if key not in parsed:
            parsed[key] = load(model_dir)
        return parsed[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(swiftlm.text.tokenizer, "_load_backend", load_once)
        yield


def make_tiny_model(dst: Path, shape: dict, seed: int = 0) -> Path:
    write_random_checkpoint(dst, shape, seed=seed, dtype=torch.float32, std=0.05)
    write_tokenizer_files(dst)
    return dst


@pytest.fixture(scope="session")
def tiny_tied_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny_tied"), TINY_TIED, seed=1)


@pytest.fixture(scope="session")
def tiny_untied_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny_untied"), TINY_UNTIED, seed=2)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny_llama"), TINY_LLAMA, seed=3)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"), TINY_QWEN2, seed=4)


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_arch_dir(request: pytest.FixtureRequest, tiny_llama_dir: Path, tiny_qwen2_dir: Path) -> Path:
    """A tiny checkpoint of each architecture beside Qwen3."""
    return tiny_llama_dir if request.param == "llama" else tiny_qwen2_dir


@pytest.fixture(scope="session", params=["tied", "untied"])
def tiny_model_dir(request: pytest.FixtureRequest, tiny_tied_dir: Path, tiny_untied_dir: Path) -> Path:
    return tiny_tied_dir if request.param == "tied" else tiny_untied_dir


SCRIPT = [198, 151667, 80022, 11, 16910, 151668, 271, 9707, 1052, 0, 151645]
REASONING = "Hmm, okay"
ANSWER = "Hello there!"


def make_scripted_model(dst: Path, script: list[int] = SCRIPT) -> Path:
    """The scripted checkpoint; ``script`` is its chain of token ids (each id at most once)."""
    assert len(set(script)) == len(script), "a token may appear once in the chain"
    make_tiny_model(dst, TINY_UNTIED, seed=5)
    tensors = load_file(str(dst / "model.safetensors"))
    embed = torch.randn(tensors["model.embed_tokens.weight"].shape, generator=torch.Generator().manual_seed(3))
    tensors["model.embed_tokens.weight"] = embed
    # every other token's logit small (|x| < ~0.05) and distinct: with all of them 0, each sampled
    # step's top-k (Qwen3's generation config: 20) would tie past its k-th and keep the whole
    # vocabulary as candidates, ~45 ms a token instead of ~1 ms (the script's logit is ~100 either way)
    head = 1e-3 * torch.randn(tensors["lm_head.weight"].shape, generator=torch.Generator().manual_seed(4))
    for cur, nxt in zip(script, script[1:], strict=False):
        head[nxt] += 10.0 * embed[cur] / embed[cur].norm()
    tensors["lm_head.weight"] = head
    for name in tensors:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensors[name] = torch.zeros_like(tensors[name])
        elif name.endswith("norm.weight"):
            tensors[name] = torch.ones_like(tensors[name])
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="session")
def scripted_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_scripted_model(tmp_path_factory.mktemp("scripted"))


