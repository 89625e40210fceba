"""``policy.freeze_embeddings``: full fine-tuning leaves the token embeddings and the output layer as they
were (tied or not), trains everything else, and keeps no optimizer state for them."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gym_bridge.models.tiny import TinyRecipe, random_tiny_model  # noqa: E402
from gym_bridge.models.tokenizer import build_tokenizer  # noqa: E402
from gym_bridge.train.batches.sequences import per_sample_logprobs  # noqa: E402
from gym_bridge.train.learner.lora import parameter_counts  # noqa: E402
from gym_bridge.train.learner.update import StepBatch, update_policy  # noqa: E402
from gym_bridge.train.setup import build_learner  # noqa: E402
from tests.train.helpers import offline_step_config, step_sample  # noqa: E402


def save_model(out: Path, tied: bool) -> Path:
    tokenizer = build_tokenizer()
    recipe = TinyRecipe(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    random_tiny_model(tokenizer, recipe, seed=3, tie_word_embeddings=tied).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def one_step(model_dir: Path, *overrides: str) -> tuple[dict[str, torch.Tensor], object]:
    """The weights before one offline optimizer step (lr 1e-2) and the learner after it."""
    cfg = offline_step_config(model_dir, "policy.optimizer.kwargs.lr=1e-2", *overrides)
    learner, _ = build_learner(cfg, None, rollout_process=False)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    batch = StepBatch.from_samples(cfg.grpo, [step_sample(i, float(i % 2)) for i in range(8)])
    batch.prev_logprobs = per_sample_logprobs(cfg, learner.model, batch.samples, learner.pad_token_id)
    update_policy(cfg, learner, batch)
    return before, learner


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_frozen_embeddings_and_output_layer_stay_and_everything_else_trains(tmp_path: Path, tied: bool) -> None:
    before, learner = one_step(save_model(tmp_path / "m", tied), "policy.freeze_embeddings=true")
    model = learner.model
    embedding_names = {n for n, p in model.named_parameters() if p is model.get_input_embeddings().weight}
    embedding_names |= {n for n, p in model.named_parameters() if p is model.get_output_embeddings().weight}
    assert len(embedding_names) == (1 if tied else 2)

    after = dict(model.named_parameters())
    unchanged = {n for n, p in after.items() if torch.equal(p, before[n])}
    assert embedding_names <= unchanged
    layer_weights = {n for n in after if ".layers." in n and n.endswith("proj.weight")}
    assert layer_weights and not (layer_weights & unchanged)  # every decoder projection moved

    frozen = model.get_input_embeddings().weight.numel() * (1 if tied else 2)  # same shape: vocab x hidden
    trainable, total = parameter_counts(model)
    assert trainable == total - frozen
    state = learner.optimizer.state_dict()["state"]
    assert sum(s["exp_avg"].numel() for s in state.values()) == trainable


def test_without_the_key_the_embeddings_train(tmp_path: Path) -> None:
    before, learner = one_step(save_model(tmp_path / "m", tied=True))
    weight = learner.model.get_input_embeddings().weight
    assert weight.requires_grad
    assert not torch.equal(weight, before["model.embed_tokens.weight"])
    trainable, total = parameter_counts(learner.model)
    assert trainable == total
