"""A LoRA model generates with its adapters merged for the call: the merged model's tokens, at merged
speed, and afterwards the base weights are bit for bit what they were and the adapters are back on."""

from __future__ import annotations

import pytest
import torch

from gym_bridge.generation.backend import GenerationRequest, SamplingParams
from gym_bridge.generation.transformers_backend import TransformersBackend
from gym_bridge.generation.weights import lora_merged

pytest.importorskip("peft")


@pytest.fixture()
def adapted():
    from gym_bridge.models.tiny import TinyRecipe, new_tiny_model
    from gym_bridge.models.tokenizer import build_tokenizer
    from gym_bridge.train.config.policy import LoRAConfig
    from gym_bridge.train.learner.lora import apply_lora

    tokenizer = build_tokenizer()
    recipe = TinyRecipe(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    model = new_tiny_model(tokenizer, recipe, seed=5)
    peft_model = apply_lora(model, LoRAConfig(enabled=True, dim=4))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    return model, peft_model, tokenizer


def test_lora_generation_is_the_merged_models_and_leaves_the_base_untouched(adapted) -> None:
    from gym_bridge.train.learner.lora import merged_model

    model, peft_model, tokenizer = adapted
    base_before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    with torch.no_grad():
        logits_before = model(ids).logits
    requests = [
        GenerationRequest([5, 17, 42, 99, 7], SamplingParams(max_new_tokens=12, temperature=1.0, seed=i))
        for i in range(4)
    ]
    ours = TransformersBackend(model, tokenizer).generate(requests)
    merged = TransformersBackend(merged_model(peft_model), tokenizer).generate(requests)
    assert [r.token_ids for r in ours] == [r.token_ids for r in merged]
    for a, b in zip(ours, merged, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    for name, p in model.named_parameters():
        assert torch.equal(p, base_before[name]), name  # bit for bit, adapters and base
    assert not any(getattr(m, "disable_adapters", False) for m in model.modules() if hasattr(m, "lora_A"))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, logits_before)


def test_lora_merged_computes_what_the_adapters_do_and_restores_on_error(adapted) -> None:
    model, peft_model, _ = adapted
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    with torch.no_grad():
        unmerged = model(ids).logits
        with peft_model.disable_adapter():
            base = model(ids).logits
        with lora_merged(model):
            merged = model(ids).logits
    assert not torch.allclose(unmerged, base, atol=1e-3)  # the adapters matter
    torch.testing.assert_close(merged, unmerged, rtol=1e-5, atol=1e-5)
    weights = [m.get_base_layer().weight for m in model.modules() if hasattr(m, "lora_A")]
    before = [w.data.data_ptr() for w in weights]
    with pytest.raises(RuntimeError, match="boom"), lora_merged(model):
        raise RuntimeError("boom")
    assert [w.data.data_ptr() for w in weights] == before
