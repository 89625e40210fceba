"""Each loss and advantage key changes what a training step does: the same batch on the same model
gives another loss (or other advantages) when the key is set, through the trainer's own set-up
(``build_learner``), advantages (``StepBatch.from_samples``) and update (``update_policy``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gym_bridge.train.batches.rollouts import Sample
from gym_bridge.train.config import ConfigError, load_config
from tests.train.helpers import one_trainer_step, save_random_tiny, step_sample

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_losses"), seed=5, num_layers=1)


def samples() -> list[Sample]:
    """Two groups of four completions of 2-5 generated tokens, rewards mixed within each group."""
    return [step_sample(i, float(i % 3 == 0)) for i in range(8)]


def step(model_dir: Path, *overrides: str) -> tuple[float, torch.Tensor]:
    """The loss of one optimizer step over :func:`samples` and the batch's advantages."""
    return one_trainer_step(model_dir, samples(), *overrides)


@pytest.fixture(scope="module")
def default_step(model_dir: Path) -> tuple[float, torch.Tensor]:
    return step(model_dir)


@pytest.mark.parametrize(
    ("overrides", "baseline"),
    [
        # GSPO against the same sequence-level mean with token ratios: only the ratio differs.
        (["loss_fn.sequence_level_importance_ratios=true"], ["loss_fn.token_level_loss=false"]),
        (["loss_fn.use_cispo=true"], []),
        (["loss_fn.loss_type=dr_grpo", "grpo.normalize_rewards=false"], ["grpo.normalize_rewards=false"]),
        (["loss_fn.loss_type=grpo"], []),
        (["loss_fn.ratio_clip_max=0.28"], []),
        (["loss_fn.entropy_coeff=0.01"], []),
    ],
)
def test_loss_keys_change_the_step_loss(model_dir: Path, overrides: list[str], baseline: list[str]) -> None:
    loss, advantages = step(model_dir, *overrides)
    reference, reference_advantages = step(model_dir, *baseline)
    assert torch.equal(advantages, reference_advantages)  # same batch, same advantages
    assert loss != pytest.approx(reference, rel=1e-4)


def test_dr_grpo_step_is_the_token_sum_over_sequences_times_max_new_tokens(model_dir: Path) -> None:
    # Same advantages (no std normalisation either way): the two losses share the token sum S, and
    # token mean = S / valid tokens, Dr. GRPO = S / (8 sequences x max_new_tokens 8).
    token_mean, _ = step(model_dir, "grpo.normalize_rewards=false")
    dr, _ = step(model_dir, "loss_fn.loss_type=dr_grpo")  # sets grpo.normalize_rewards=false itself
    valid_tokens = sum(s.generated_tokens for s in samples())  # 2+3+4+5 twice = 28
    assert dr == pytest.approx(token_mean * valid_tokens / (8 * 8), rel=1e-5)


@pytest.mark.parametrize(
    "overrides",
    [
        ["grpo.adv_estimator.name=reinforce_plus_plus"],
        ["grpo.adv_estimator.name=reinforce_plus_plus", "grpo.adv_estimator.minus_baseline=false"],
        ["grpo.reward_shaping.enabled=true", "grpo.reward_shaping.overlong_buffer_length=6"],
        ["grpo.normalize_rewards=false"],
    ],
)
def test_advantage_keys_change_the_advantages_and_the_step_loss(
    model_dir: Path, overrides: list[str], default_step: tuple[float, torch.Tensor]
) -> None:
    loss, advantages = step(model_dir, *overrides)
    assert not torch.allclose(advantages, default_step[1])
    assert loss != pytest.approx(default_step[0], rel=1e-4)


def test_minus_baseline_changes_reinforce_plus_plus(model_dir: Path) -> None:
    with_baseline = step(model_dir, "grpo.adv_estimator.name=reinforce_plus_plus")[1]
    raw = step(
        model_dir, "grpo.adv_estimator.name=reinforce_plus_plus", "grpo.adv_estimator.minus_baseline=false"
    )[1]
    assert not torch.allclose(with_baseline, raw)


def test_dapo_recipe_is_the_tiny_recipe_with_dapo_s_four_parts() -> None:
    cfg = load_config(ROOT / "recipes" / "dapo_math_tiny.yaml", [])
    assert cfg.loss_fn.ratio_clip_max > cfg.loss_fn.ratio_clip_min  # clip-higher
    assert cfg.loss_fn.token_level_loss  # token-level policy-gradient loss
    assert cfg.grpo.use_dynamic_sampling  # dynamic sampling
    shaping = cfg.grpo.reward_shaping  # overlong reward shaping
    assert shaping.enabled and shaping.max_response_length == cfg.policy.generation.max_new_tokens
    assert cfg.loss_fn.reference_policy_kl_penalty == 0.0  # DAPO drops the KL term


def test_dr_grpo_refuses_std_normalisation_set_explicitly() -> None:
    with pytest.raises(
        ConfigError, match="grpo.normalize_rewards=true contradicts loss_fn.loss_type='dr_grpo'"
    ):
        load_config(
            None,
            [
                "data.train.data_path=a.jsonl",
                "grpo.mode=offline",
                "grpo.normalize_rewards=true",
                "loss_fn.loss_type=dr_grpo",
            ],
        )
