"""GGUF checkpoints: tiny random Llama, Qwen2 and Qwen3 models written as GGUF (as llama.cpp's
converter writes them) load to the same weights and tokens as their safetensors originals; the
quantised types stay within their quantisation error; bad files fail with messages that name the
problem; hub ids, ``--gguf-file`` and ``repo:QUANT`` resolve offline from a hub cache."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from swiftlm.backends.attention import DenseAttention
from swiftlm.config import ModelConfig
from swiftlm.core.gguf_file import GGUFError, GGUFFile
from swiftlm.model.gguf_checkpoint import gguf_model_config
from swiftlm.model.loader import LoadError, load_model, load_tokenizer, resolve_model
from swiftlm.plain import PlainLLM
from swiftlm.sampling import SamplingParams
from swiftlm.text.tokenizer import Tokenizer
from tests.model.test_loader import fake_hub_cache

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
PROMPT_IDS = [(37 * i + 11) % 151000 for i in range(24)]


def gguf_dir(src: Path, dst: Path) -> Path:
    """A directory for GGUF files beside ``src``'s tokenizer files (no config.json)."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in _TOKENIZER_FILES:
        shutil.copyfile(src / name, dst / name)
    return dst


def write(src: Path, dst: Path, qtype: Q = Q.F32, **kwargs) -> Path:
    from tests.helpers.gguf_files import write_gguf

    return write_gguf(src, dst, qtype, **kwargs)


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def arch_dirs(request, tmp_path_factory, tiny_llama_dir, tiny_qwen2_dir, tiny_untied_dir) -> tuple[Path, Path]:
    """(the safetensors checkpoint, a directory holding its F32 and BF16 GGUF files)."""
    src = {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir, "qwen3": tiny_untied_dir}[request.param]
    out = gguf_dir(src, tmp_path_factory.mktemp(f"gguf_{request.param}"))
    write(src, out / "model-F32.gguf", Q.F32)
    write(src, out / "model-BF16.gguf", Q.BF16)
    return src, out


def logits(model, ids: list[int]) -> torch.Tensor:
    attention = DenseAttention(model.config.num_hidden_layers)
    hidden = model(torch.tensor(ids), torch.arange(len(ids)), attention.bind(["r"], [len(ids)]))
    return model.compute_logits(hidden)


def greedy(model, ids: list[int], n: int) -> list[int]:
    """n greedy tokens, the whole sequence recomputed each step (tiny models: cheap and obviously right)."""
    ids = list(ids)
    for _ in range(n):
        ids.append(int(logits(model, ids)[-1].argmax()))
    return ids[-n:]


def test_config_from_metadata_matches_config_json(arch_dirs) -> None:
    src, out = arch_dirs
    from_json = ModelConfig.from_model_dir(src)
    from_gguf = gguf_model_config(GGUFFile(out / "model-F32.gguf"))
    ignore = {"torch_dtype", "rope_scaling"}
    for name in ModelConfig.__dataclass_fields__:
        if name not in ignore:
            assert getattr(from_gguf, name) == getattr(from_json, name), name
    if from_json.rope_scaling is not None:  # Llama 3's scaling arrives as per-frequency factors
        assert from_gguf.rope_scaling is not None and from_gguf.rope_scaling["rope_type"] == "factors"


def test_f32_gguf_loads_the_same_weights_and_greedy_tokens(arch_dirs) -> None:
    src, out = arch_dirs
    ref = load_model(src, torch.float32)
    model = load_model(out / "model-F32.gguf", torch.float32)
    ref_state, state = ref.state_dict(), model.state_dict()
    assert set(state) == set(ref_state)
    for name, tensor in ref_state.items():  # q/k un-permuted for llama, biases and norms in place
        assert torch.equal(state[name], tensor), name
    delta = (logits(ref, PROMPT_IDS) - logits(model, PROMPT_IDS)).abs().max().item()
    print(f"\n{ref.config.architecture} F32 GGUF: max |delta logit| {delta:.2e}")
    assert delta < 1e-4  # Llama's rope factors round in float32; the weights are equal
    assert greedy(model, PROMPT_IDS, 12) == greedy(ref, PROMPT_IDS, 12)


def test_bf16_gguf_holds_the_bf16_rounding_of_each_weight(arch_dirs) -> None:
    src, out = arch_dirs
    ref = load_model(src, torch.float32).state_dict()
    for dtype in (torch.float32, torch.bfloat16):
        state = load_model(out / "model-BF16.gguf", dtype).state_dict()
        for name, tensor in ref.items():
            want = tensor.bfloat16().to(dtype) if tensor.dim() == 2 else tensor.to(dtype)  # norms stay F32
            assert state[name].dtype == dtype and torch.equal(state[name], want), name


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0], ids=["Q8_0", "Q4_0"])
def test_quantised_gguf_stays_within_its_quantisation_error(qtype: Q, tmp_path: Path, tiny_llama_dir: Path) -> None:
    path = write(tiny_llama_dir, tmp_path / f"model-{qtype.name}.gguf", qtype)
    types = {t.tensor_type for t in (GGUFFile(path).tensor(n) for n in GGUFFile(path).tensor_names())}
    assert qtype in types
    ref = load_model(tiny_llama_dir, torch.float32)
    model = load_model(path, torch.float32)
    levels = 127 if qtype == Q.Q8_0 else 8  # one step of the block scale, relative to the block's max
    ref_state = ref.state_dict()
    for name, weight in model.state_dict().items():
        want = ref_state[name]
        if want.dim() == 2:  # each value within one quantisation step (max |block| / levels) of the original
            step = want.reshape(want.shape[0], -1, 32).abs().amax(-1, keepdim=True) / levels
            err = (weight - want).reshape(step.shape[0], -1, 32).abs()
            assert bool((err <= step * 1.01 + 1e-6).all()), name
    a, b = logits(ref, PROMPT_IDS), logits(model, PROMPT_IDS)
    delta = (a - b).abs().max().item()
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    print(f"\nLlama {qtype.name} GGUF: max |delta logit| {delta:.3f} (logit std {a.std().item():.2f}), "
          f"top-1 agreement {agree:.2f}")
    assert delta < (0.1 if qtype == Q.Q8_0 else 1.5) * a.std().item()


@pytest.fixture(scope="module")
def qwen3_q8_with_tokenizer(tmp_path_factory, tiny_tied_dir) -> Path:
    """The tied Qwen3 checkpoint as Q8_0, with Qwen3's tokenizer in its metadata (written once: 151k tokens)."""
    return write(tiny_tied_dir, tmp_path_factory.mktemp("qwen3_tok") / "tiny-Q8_0.gguf", Q.Q8_0, tokenizer=True)


def test_gguf_tokenizer_metadata_equals_the_tokenizer_files(qwen3_q8_with_tokenizer: Path, tiny_tied_dir: Path) -> None:
    source = resolve_model(qwen3_q8_with_tokenizer)
    assert not source.tokenizer_in_directory
    ours, want = load_tokenizer(source), Tokenizer.from_dir(tiny_tied_dir)
    texts = ["Hello, world!", "naïve café 東京 🚀", "def f(x):\n    return x ** 2  # 12345",
             "  leading\tand trailing  \n\n", "<|im_start|>user\nhi<|im_end|><think>x</think>", "I'm 100% sure it's 3.14"]
    for text in texts:
        assert ours.encode(text) == want.encode(text), text
        assert ours.decode(ours.encode(text), skip_special_tokens=False) == text
    assert ours.eos_token_id == want.eos_token_id and ours.pad_token_id == want.pad_token_id
    assert ours.special_token_ids == want.special_token_ids
    assert (ours.think_start_id, ours.think_end_id) == (want.think_start_id, want.think_end_id)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert ours.apply_chat_template(messages, enable_thinking=False) == want.apply_chat_template(
        messages, enable_thinking=False)


# -- errors ------------------------------------------------------------------------------------
def test_unknown_architecture_is_named(tmp_path: Path, tiny_tied_dir: Path) -> None:
    path = write(tiny_tied_dir, tmp_path / "m.gguf", arch="gptneox")
    with pytest.raises(GGUFError, match="architecture 'gptneox' is not supported.*llama, qwen2, qwen3"):
        load_model(path)


def test_unsupported_tensor_type_names_the_tensor_and_type(tmp_path: Path, tiny_tied_dir: Path) -> None:
    path = write(tiny_tied_dir, tmp_path / "m.gguf", types={"blk.1.ffn_up.weight": Q.Q5_0})
    with pytest.raises(GGUFError, match=r"tensor blk\.1\.ffn_up\.weight has type Q5_0.*supported: F32"):
        load_model(path)


def test_missing_tensor_is_named(tmp_path: Path, tiny_tied_dir: Path) -> None:
    path = write(tiny_tied_dir, tmp_path / "m.gguf", drop={"blk.0.attn_k_norm.weight"})
    with pytest.raises(GGUFError, match=r"missing tensors.*model\.layers\.0\.self_attn\.k_norm\.weight"):
        load_model(path)


@pytest.mark.parametrize("where", ["in-tensor-data", "in-header"])
def test_truncated_file_is_a_clear_error(where: str, tmp_path: Path, tiny_tied_dir: Path) -> None:
    path = write(tiny_tied_dir, tmp_path / "m.gguf")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 if where == "in-tensor-data" else 200])
    with pytest.raises(GGUFError, match="truncated"):
        load_model(path)


def test_directory_with_no_or_two_ggufs(tmp_path: Path, tiny_tied_dir: Path) -> None:
    with pytest.raises(LoadError, match="has no config.json .* and no .gguf file"):
        resolve_model(tmp_path)
    write(tiny_tied_dir, tmp_path / "a.gguf")
    assert resolve_model(tmp_path).gguf.path == tmp_path / "a.gguf"  # one .gguf: that one
    shutil.copyfile(tmp_path / "a.gguf", tmp_path / "b.gguf")
    with pytest.raises(LoadError, match="holds 2 .gguf files .*--gguf-file"):
        resolve_model(tmp_path)
    assert resolve_model(tmp_path, gguf_file="b.gguf").gguf.path == tmp_path / "b.gguf"


# -- hub ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gguf_hub(tmp_path_factory, qwen3_q8_with_tokenizer) -> tuple[Path, Path]:
    """A hub cache holding ``swiftlm-test/tiny-GGUF`` (no config.json, no tokenizer files: the
    tokenizer comes from the metadata), offline; (cache, snapshot)."""
    files = tmp_path_factory.mktemp("gguf_repo")
    shutil.copyfile(qwen3_q8_with_tokenizer, files / "tiny-Q8_0.gguf")
    shutil.copyfile(files / "tiny-Q8_0.gguf", files / "tiny-Q4_0.gguf")  # only its name is looked at
    cache = tmp_path_factory.mktemp("gguf_hub")
    return cache, fake_hub_cache(cache, "swiftlm-test/tiny-GGUF", files)


@pytest.fixture
def offline_hub(gguf_hub, monkeypatch) -> Path:
    import huggingface_hub.constants as c

    cache, snapshot = gguf_hub
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    return snapshot


def test_repo_colon_quant_picks_that_file_offline(offline_hub: Path) -> None:
    source = resolve_model("swiftlm-test/tiny-GGUF:q4_0")
    assert source.gguf is not None and source.gguf.path.name == "tiny-Q4_0.gguf"
    assert source.gguf.path.resolve() == (offline_hub / "tiny-Q4_0.gguf").resolve()
    with pytest.raises(LoadError, match="no .gguf file for quantisation 'Q4_K_M'.*tiny-Q4_0.gguf, tiny-Q8_0.gguf"):
        resolve_model("swiftlm-test/tiny-GGUF:Q4_K_M")
    with pytest.raises(LoadError, match="HF_HUB_OFFLINE"):
        resolve_model("swiftlm-test/not-cached-GGUF:Q4_0")


def test_hub_id_with_gguf_file_serves_through_the_engine(offline_hub: Path, tiny_tied_dir: Path) -> None:
    from swiftlm import LLM

    with pytest.raises(LoadError, match="has no config.json; for a GGUF repo give --gguf-file NAME"):
        resolve_model("swiftlm-test/tiny-GGUF")
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    llm = LLM("swiftlm-test/tiny-GGUF", dtype="float32", gguf_file="tiny-Q8_0.gguf")
    assert llm.engine.source.gguf.path.name == "tiny-Q8_0.gguf"
    got = llm.generate(["Hello there"], params)[0]
    plain = PlainLLM("swiftlm-test/tiny-GGUF:Q8_0", dtype="float32").generate(["Hello there"], params)[0]
    assert got.prompt_token_ids == Tokenizer.from_dir(tiny_tied_dir).encode("Hello there")
    assert got.outputs[0].token_ids == plain.outputs[0].token_ids
    with pytest.raises(LoadError, match="'absent.gguf' in 'swiftlm-test/tiny-GGUF'"):
        resolve_model("swiftlm-test/tiny-GGUF", gguf_file="absent.gguf")


def test_serve_flag_gguf_file_reaches_the_engine_config() -> None:
    from swiftlm.cli import build_configs, build_parser

    engine, _ = build_configs(build_parser().parse_args(["serve", "org/repo-GGUF", "--gguf-file", "m-Q4_K_M.gguf"]))
    assert (engine.model, engine.gguf_file) == ("org/repo-GGUF", "m-Q4_K_M.gguf")
    args = build_parser().parse_args(["generate", "--model", "org/repo-GGUF", "--gguf-file", "x.gguf", "hi"])
    assert args.gguf_file == "x.gguf"
