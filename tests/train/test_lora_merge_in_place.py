"""Generation's LoRA merge is written into the base weights in place (no second copy of the linear
layers) and undone bit for bit, over many merge/unmerge cycles with changing adapters."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from gym_bridge.generation import weights as weights_module  # noqa: E402
from gym_bridge.generation.weights import lora_merged  # noqa: E402


def adapted(seed: int = 5) -> tuple[Any, Any]:
    from gym_bridge.models.tiny import TinyRecipe, new_tiny_model
    from gym_bridge.models.tokenizer import build_tokenizer
    from gym_bridge.train.config.policy import LoRAConfig
    from gym_bridge.train.learner.lora import apply_lora

    recipe = TinyRecipe(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    model = new_tiny_model(build_tokenizer(), recipe, seed=seed).float()
    return model, apply_lora(model, LoRAConfig(enabled=True, dim=4))


def base_weights(model: Any) -> list[Any]:
    return [m.get_base_layer().weight for m in model.modules() if hasattr(m, "lora_A")]


def set_adapters(model: Any, scale: float, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, scale, generator=generator)


def test_many_cycles_leave_the_base_bit_for_bit_and_merge_in_place() -> None:
    model, _ = adapted()
    weights = base_weights(model)
    before = [w.detach().clone() for w in weights]
    pointers = [w.data_ptr() for w in weights]
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    for cycle in range(60):  # a training run: the adapters change between generations
        set_adapters(model, scale=0.0005, seed=cycle)  # deltas ~10% of the weights
        with torch.no_grad():
            unmerged = model(ids).logits
            with lora_merged(model):
                assert [w.data_ptr() for w in base_weights(model)] == pointers  # no new tensors
                assert any(not torch.equal(w, b) for w, b in zip(weights, before, strict=True))
                merged = model(ids).logits
        torch.testing.assert_close(merged, unmerged, rtol=1e-5, atol=1e-5)
        for w, b in zip(weights, before, strict=True):
            assert torch.equal(w, b)  # no drift, not even one ulp
        assert not any(getattr(m, "disable_adapters", False) for m in model.modules() if hasattr(m, "lora_A"))


@pytest.mark.parametrize("scale", [0.0005, 0.02], ids=["in_place", "swapped"])
def test_merged_in_place_is_the_same_merge_as_a_merged_copy(scale: float) -> None:
    from gym_bridge.train.learner.lora import merged_model

    model, peft_model = adapted()
    set_adapters(model, scale=scale, seed=1)  # 0.02: deltas larger than the weights, layers swapped
    expected = merged_model(peft_model).state_dict()
    with lora_merged(model):
        state = weights_module.plain_state_dict(model)  # adapters off inside: the base names hold W + d
    for key, tensor in expected.items():
        assert torch.equal(state[key], tensor), key


def test_layers_that_would_store_too_much_are_swapped_and_restored(monkeypatch: Any) -> None:
    model, _ = adapted()
    set_adapters(model, scale=0.02, seed=2)
    monkeypatch.setattr(weights_module, "MAX_RESTORE_SHARE", 0.0)  # every rounding error is too many
    weights = base_weights(model)
    before = [w.detach().clone() for w in weights]
    pointers = [w.data_ptr() for w in weights]
    with lora_merged(model):
        inside = [w.data_ptr() for w in base_weights(model)]
    assert all(a != b for a, b in zip(inside, pointers, strict=True))  # every layer got a new tensor
    assert [w.data_ptr() for w in base_weights(model)] == pointers
    for w, b in zip(base_weights(model), before, strict=True):
        assert torch.equal(w, b)


def test_a_delta_that_does_not_come_back_is_reported(monkeypatch: Any) -> None:
    model, _ = adapted()
    set_adapters(model, scale=0.0005, seed=3)
    with pytest.raises(RuntimeError, match="did not come back exactly"), lora_merged(model):
        with torch.no_grad():  # the adapters change inside the block: the undoing cannot be exact
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.add_(0.5)


def test_the_merge_offers_the_heap_back_after_every_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first merge of a run kept every layer's freed temporaries resident until the last layer
    (0.6 GiB on SmolLM2-135M): after each layer the merge asks for a trim, subject to its minimum gain."""
    model, _ = adapted()
    calls: list[int] = []
    monkeypatch.setattr(weights_module, "release_freed_memory", lambda min_gain=0: calls.append(min_gain) or True)
    with lora_merged(model):
        pass
    layers = len(base_weights(model))
    assert calls == [weights_module.MERGE_RELEASE_MIN_GAIN] * layers + [0]
