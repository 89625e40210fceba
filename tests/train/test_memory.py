"""Memory: no second full copy of the weights for the KL reference where none is needed, and
``policy.dtensor_cfg.activation_checkpointing`` trading activation memory for recompute with equal
gradients (a random tiny Llama)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gym_bridge.train.config import load_config
from tests.train.helpers import save_random_tiny

DTENSOR = "policy.dtensor_cfg"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_memory"), seed=3)


def learner_for(tmp: Path, model_dir: Path, *extra: str) -> Any:
    from gym_bridge.train.setup import build_learner

    cfg = load_config(
        None,
        [
            "grpo.mode=offline",
            "data.train.data_path=unused.jsonl",
            "grpo.num_prompts_per_step=2",
            "grpo.num_generations_per_prompt=4",
            f"policy.model_name={model_dir}",
            "policy.train_global_batch_size=8",
            "policy.max_total_sequence_length=32",
            "policy.generation.max_new_tokens=8",
            f"checkpointing.checkpoint_dir={tmp / 'ckpt'}",
            f"logger.log_dir={tmp / 'logs'}",
            *extra,
        ],
    )
    return build_learner(cfg, None, rollout_process=False)[0]


def weight_bytes(*models: Any) -> int:
    """Bytes of the distinct tensor storages the models' parameters and buffers live in."""
    storages: dict[int, int] = {}
    for model in models:
        if model is None:
            continue
        for tensor in [*model.parameters(), *model.buffers()]:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def test_lora_reference_is_the_base_model_not_a_copy(tmp_path: Path, model_dir: Path) -> None:
    pytest.importorskip("peft")
    plain = learner_for(tmp_path / "plain", model_dir, "loss_fn.reference_policy_kl_penalty=0")
    base = weight_bytes(plain.model)
    learner = learner_for(
        tmp_path / "lora", model_dir, "loss_fn.reference_policy_kl_penalty=0.05",
        f"{DTENSOR}.lora_cfg.enabled=true", f"{DTENSOR}.lora_cfg.dim=4",
    )  # fmt: skip
    assert learner.has_reference and learner.reference is None
    with learner.reference_policy() as reference:
        assert reference is learner.model
        held = weight_bytes(learner.model, reference)
    adapters = sum(p.numel() * p.element_size() for p in learner.model.parameters() if p.requires_grad)
    assert held == pytest.approx(base + adapters, rel=0.01)  # one copy of the base, plus the adapters
    assert adapters < 0.2 * base


def test_full_fine_tuning_copies_the_reference_only_for_a_kl_penalty(tmp_path: Path, model_dir: Path) -> None:
    without = learner_for(tmp_path / "kl0", model_dir, "loss_fn.reference_policy_kl_penalty=0")
    assert without.reference is None and not without.has_reference
    base = weight_bytes(without.model)
    with_kl = learner_for(tmp_path / "kl", model_dir, "loss_fn.reference_policy_kl_penalty=0.05")
    # The policy's weights change every step, so a KL reference needs its own frozen copy.
    assert with_kl.reference is not None
    assert weight_bytes(with_kl.model, with_kl.reference) == pytest.approx(2 * base, rel=0.01)


def loss_and_saved_bytes(model: Any, ids: torch.Tensor) -> tuple[dict[str, torch.Tensor], int, int]:
    """(gradients, bytes autograd saved for the backward pass, decoder-layer forward calls) of one step."""
    calls = 0

    def count(*_: Any) -> None:
        nonlocal calls
        calls += 1

    # the recompute calls the layer's forward directly, so count its MLP's calls
    hooks = [layer.mlp.register_forward_pre_hook(count) for layer in model.model.layers]
    saved = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += tensor.numel() * tensor.element_size()
        return tensor

    model.train()
    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(input_ids=ids, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    for hook in hooks:
        hook.remove()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return grads, saved, calls


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_activation_checkpointing_recomputes_saves_less_and_keeps_gradients(
    tmp_path: Path, model_dir: Path, lora: bool
) -> None:
    extra = [f"{DTENSOR}.lora_cfg.enabled=true", f"{DTENSOR}.lora_cfg.dim=4"] if lora else []
    if lora:
        pytest.importorskip("peft")
    plain = learner_for(tmp_path / "plain", model_dir, *extra)
    checkpointed = learner_for(tmp_path / "ckpt", model_dir, *extra, f"{DTENSOR}.activation_checkpointing=true")
    if lora:  # same adapters in both (A is random): copy them over, and give B a value so it matters
        with torch.no_grad():
            for (_, p), (_, q) in zip(plain.model.named_parameters(), checkpointed.model.named_parameters(), strict=True):
                if p.requires_grad:
                    p.normal_(0, 0.1)
                    q.copy_(p)
    ids = torch.randint(10, 200, (4, 24), generator=torch.Generator().manual_seed(0))
    grads, saved, calls = loss_and_saved_bytes(plain.model, ids)
    grads_ckpt, saved_ckpt, calls_ckpt = loss_and_saved_bytes(checkpointed.model, ids)
    layers = len(plain.model.model.layers)
    assert calls == layers and calls_ckpt == 2 * layers  # each layer runs again in the backward pass
    assert saved_ckpt < 0.6 * saved
    assert grads.keys() == grads_ckpt.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(grads_ckpt[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_activation_checkpointing_turns_prompt_sharing_off(tmp_path: Path, model_dir: Path) -> None:
    from gym_bridge.models.shared_prefix import shares_prefixes

    assert shares_prefixes(learner_for(tmp_path / "a", model_dir).model)
    learner = learner_for(tmp_path / "b", model_dir, f"{DTENSOR}.activation_checkpointing=true")
    assert not shares_prefixes(learner.model)


def test_activation_checkpointing_key_is_checked(tmp_path: Path, model_dir: Path) -> None:
    from gym_bridge.train.config import ConfigError

    with pytest.raises(ConfigError, match="activation_checkpointing"):
        learner_for(tmp_path, model_dir, f"{DTENSOR}.activation_checkpointing=maybe")


def test_lora_snapshot_merges_like_plain_state_dict_without_copying_the_base(
    tmp_path: Path, model_dir: Path
) -> None:
    pytest.importorskip("peft")
    from gym_bridge.generation.weights import MergedLoraWeights, plain_state_dict
    from gym_bridge.train.setup import weights_snapshot

    learner = learner_for(tmp_path, model_dir, f"{DTENSOR}.lora_cfg.enabled=true", f"{DTENSOR}.lora_cfg.dim=4")
    with torch.no_grad():
        for p in learner.model.parameters():
            if p.requires_grad:
                p.normal_(0, 0.1)
    snapshot = weights_snapshot(learner.model)
    assert isinstance(snapshot, MergedLoraWeights)
    merged = plain_state_dict(learner.model)
    assert snapshot.keys() == merged.keys()
    for key, tensor in merged.items():
        torch.testing.assert_close(snapshot[key], tensor, rtol=1e-6, atol=1e-6, msg=key)
    base_ptrs = {p.data_ptr() for p in learner.model.parameters() if not p.requires_grad}
    unadapted = [k for k in snapshot if not snapshot.is_merged(k)]
    assert unadapted and all(snapshot[k].data_ptr() in base_ptrs for k in unadapted if "weight" in k)
    # The snapshot is frozen: training the adapters afterwards does not change what it reads.
    adapted = next(k for k in snapshot if snapshot.is_merged(k))
    before = snapshot[adapted].clone()
    with torch.no_grad():
        for p in learner.model.parameters():
            if p.requires_grad:
                p.add_(1.0)
    torch.testing.assert_close(snapshot[adapted], before)


def test_rollout_process_weights_are_one_shared_copy_with_ties_kept() -> None:
    from gym_bridge.train.samplers.rollout_worker import _shared_copy

    embedding = torch.randn(10, 4)
    weights = {"embed.weight": embedding, "head.weight": embedding, "norm.weight": torch.ones(4)}
    shared = _shared_copy(weights)
    assert shared["embed.weight"] is shared["head.weight"]
    assert all(t.is_shared() for t in shared.values())
    assert shared["embed.weight"].data_ptr() != embedding.data_ptr()
    torch.testing.assert_close(shared["head.weight"], embedding)
