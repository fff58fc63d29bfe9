"""Loading checkpoints: local directories, the hub cache, dtypes, and errors that name the problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from swiftlm.config import ConfigError
from swiftlm.model.loader import LoadError, load_model, resolve_model_dir


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def rewrite_tensors(model_dir: Path, edit) -> None:
    tensors = load_file(str(model_dir / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(model_dir / "model.safetensors"))


def test_missing_tensors_are_named(tiny_tied_dir: Path, tmp_path: Path) -> None:
    d = copy_model(tiny_tied_dir, tmp_path / "m")
    rewrite_tensors(d, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(LoadError, match=r"missing tensors: model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(d)


def test_extra_tensors_are_named(tiny_tied_dir: Path, tmp_path: Path) -> None:
    d = copy_model(tiny_tied_dir, tmp_path / "m")
    rewrite_tensors(d, lambda t: t.update({"model.layers.0.self_attn.rotary_emb.inv_freq": torch.zeros(8)}))
    with pytest.raises(LoadError, match=r"unexpected tensors: model\.layers\.0\.self_attn\.rotary_emb\.inv_freq"):
        load_model(d)


def test_shape_mismatch_names_tensor_and_both_shapes(tiny_tied_dir: Path, tmp_path: Path) -> None:
    d = copy_model(tiny_tied_dir, tmp_path / "m")
    rewrite_tensors(d, lambda t: t.update({"model.norm.weight": torch.ones(65)}))
    with pytest.raises(LoadError, match=r"model\.norm\.weight has shape \(65,\).*expects \(64,\)"):
        load_model(d)


def test_unsupported_architecture_says_what_is_supported(tiny_tied_dir: Path, tmp_path: Path) -> None:
    d = copy_model(tiny_tied_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"'MambaForCausalLM' is not supported; swiftlm supports Qwen3ForCausalLM"):
        load_model(d)


def test_directory_without_config(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(LoadError, match="has no config.json"):
        resolve_model_dir(tmp_path / "empty")


def test_directory_without_weights(tiny_tied_dir: Path, tmp_path: Path) -> None:
    d = copy_model(tiny_tied_dir, tmp_path / "m")
    (d / "model.safetensors").unlink()
    with pytest.raises(LoadError, match=r"no \*\.safetensors"):
        load_model(d)


def test_unknown_dtype(tiny_tied_dir: Path) -> None:
    with pytest.raises(ConfigError, match="dtype 'int3' is not supported"):
        load_model(tiny_tied_dir, "int3")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dtype_conversion_and_tied_head(tiny_tied_dir: Path, dtype: torch.dtype) -> None:
    model = load_model(tiny_tied_dir, dtype)
    assert all(p.dtype == dtype for p in model.parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    stored = load_file(str(tiny_tied_dir / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(model.model.embed_tokens.weight, stored.to(dtype))


def test_untied_head_is_its_own_tensor(tiny_untied_dir: Path) -> None:
    model = load_model(tiny_untied_dir, "float32")
    assert model.lm_head.weight is not model.model.embed_tokens.weight


def test_sharded_checkpoint(tiny_untied_dir: Path, tmp_path: Path) -> None:
    d = copy_model(tiny_untied_dir, tmp_path / "m")
    tensors = load_file(str(d / "model.safetensors"))
    names = sorted(tensors)
    save_file({n: tensors[n] for n in names[: len(names) // 2]}, str(d / "model-00001-of-00002.safetensors"))
    save_file({n: tensors[n] for n in names[len(names) // 2 :]}, str(d / "model-00002-of-00002.safetensors"))
    (d / "model.safetensors").unlink()
    model = load_model(d, "float32")
    assert torch.equal(model.lm_head.weight, tensors["lm_head.weight"])


def fake_hub_cache(cache: Path, repo_id: str, model_dir: Path) -> Path:
    """The layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<commit>/...}."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    shutil.copytree(model_dir, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_hub_id_resolves_from_the_local_cache_offline(tiny_tied_dir: Path, tmp_path: Path, monkeypatch) -> None:
    snapshot = fake_hub_cache(tmp_path / "hub", "swiftlm-test/tiny-qwen3", tiny_tied_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    resolved = resolve_model_dir("swiftlm-test/tiny-qwen3")
    assert resolved.resolve() == snapshot.resolve()
    from swiftlm import LLM, SamplingParams

    out = LLM("swiftlm-test/tiny-qwen3", dtype="float32").generate("hi", SamplingParams(max_tokens=2, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 2


def test_hub_id_missing_offline_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    import huggingface_hub.constants as c

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    with pytest.raises(LoadError, match="HF_HUB_OFFLINE"):
        resolve_model_dir("swiftlm-test/not-downloaded")
