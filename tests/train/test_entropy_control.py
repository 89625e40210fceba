"""Adaptive entropy control (``loss_fn.entropy_target``): the coefficient follows the samples' entropy
by the documented rule, reaches the loss, survives a resume, and its keys refuse what they cannot do."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from gym_bridge.train.algorithm.entropy_control import EntropyControl, sampled_entropy
from gym_bridge.train.batches.rollouts import Sample
from gym_bridge.train.bookkeeping.logging import read_metrics
from gym_bridge.train.config import load_config
from gym_bridge.train.config.loss import ClippedPGLossConfig
from gym_bridge.train.loop import train
from tests.train.helpers import PARITY_SERVER, SMALL_ONLINE_RUN, save_random_tiny, write_say_prompts


def sample_with_entropy(per_token: list[float]) -> Sample:
    """Two prompt tokens, then one generated token per entry, each with log-prob -entry."""
    n = len(per_token)
    return Sample(
        group=0,
        token_ids=list(range(2 + n)),
        loss_mask=[0, 0] + [1] * n,
        reward=0.0,
        generation_logprobs=[-9.0, -9.0] + [-h for h in per_token],  # prompt positions are not counted
    )


def test_sampled_entropy_is_the_mean_negative_logprob_of_generated_tokens() -> None:
    samples = [sample_with_entropy([0.1, 0.3]), sample_with_entropy([0.8])]
    assert sampled_entropy(samples) == pytest.approx((0.1 + 0.3 + 0.8) / 3)
    unknown = Sample(group=0, token_ids=[1, 2], loss_mask=[0, 1], reward=0.0)
    assert sampled_entropy([unknown, *samples]) == pytest.approx((0.1 + 0.3 + 0.8) / 3)
    assert sampled_entropy([unknown]) is None


def test_the_coefficient_rises_below_the_target_decays_above_and_applies_only_below() -> None:
    control = EntropyControl.from_config(
        ClippedPGLossConfig(entropy_target=0.2, entropy_coeff_delta=0.01, entropy_coeff=0.005)
    )
    entropies = [0.30, 0.15, 0.10, 0.25, 0.40, 0.10]
    applied, coeffs = [], []
    for h in entropies:
        bonus, metrics = control.step([sample_with_entropy([h])])
        applied.append(bonus)
        coeffs.append(control.coeff)
        assert metrics == {"sampled_entropy": pytest.approx(h), "entropy_coeff": bonus}
    # c_0 = 0.005; -0.01 clipped at 0; +0.01; +0.01; -0.01; -0.01; +0.01
    assert coeffs == pytest.approx([0.0, 0.01, 0.02, 0.01, 0.0, 0.01])
    assert applied == pytest.approx([0.0, 0.01, 0.02, 0.0, 0.0, 0.01])


def test_without_a_target_the_coefficient_is_fixed() -> None:
    control = EntropyControl.from_config(ClippedPGLossConfig(entropy_coeff=0.03))
    for h in (0.01, 5.0):
        assert control.step([sample_with_entropy([h])]) == (0.03, {"entropy_coeff": 0.03})
    assert EntropyControl.from_config(ClippedPGLossConfig()).step([]) == (0.0, {})


def test_the_delta_defaults_to_skywork_or1s_step_and_a_dumped_config_round_trips() -> None:
    cfg = ClippedPGLossConfig(entropy_target=0.2)
    assert EntropyControl.from_config(cfg).delta == 0.005
    assert ClippedPGLossConfig.model_validate(ClippedPGLossConfig().model_dump()) == ClippedPGLossConfig()
    assert ClippedPGLossConfig.model_validate(cfg.model_dump()) == cfg


def test_a_target_without_sampler_logprobs_is_a_clear_error() -> None:
    control = EntropyControl.from_config(ClippedPGLossConfig(entropy_target=0.2))
    with pytest.raises(ValueError, match="loss_fn.entropy_target.*log-probs"):
        control.step([Sample(group=0, token_ids=[1, 2], loss_mask=[0, 1], reward=0.0)])


def test_the_keys_refuse_what_they_cannot_do() -> None:
    with pytest.raises(ValidationError, match="entropy_coeff_delta.*needs.*entropy_target"):
        ClippedPGLossConfig(entropy_coeff_delta=0.01)
    with pytest.raises(ValidationError, match="entropy_target"):
        ClippedPGLossConfig(entropy_target=0.0)
    with pytest.raises(ValidationError, match="entropy_coeff_delta"):
        ClippedPGLossConfig(entropy_target=0.2, entropy_coeff_delta=-0.01)


@pytest.mark.timeout(300)
def test_the_trainer_applies_the_adapted_coefficient_and_a_resume_keeps_it(tmp_path: Path) -> None:
    model_dir = save_random_tiny(tmp_path / "tiny", seed=3)
    prompts = write_say_prompts(tmp_path / "say.jsonl", 16)

    def run(steps: int) -> list[dict]:
        cfg = load_config(
            None,
            [
                *SMALL_ONLINE_RUN,
                f"grpo.max_num_steps={steps}",
                "grpo.val_period=0",
                "loss_fn.entropy_target=100.0",  # a random model's entropy is far below: the bonus grows
                "loss_fn.entropy_coeff_delta=0.02",
                f"policy.model_name={model_dir}",
                "policy.train_micro_batch_size=16",
                f"data.train.data_path={prompts}",
                "data.train.env_name=parity",
                f"env.parity.server={PARITY_SERVER}",
                f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
                "checkpointing.save_period=2",
                f"logger.log_dir={tmp_path / 'logs'}",
                "logger.tensorboard_enabled=false",
            ],
        )
        train(cfg, show_progress=False)
        return [r for r in read_metrics(tmp_path / "logs") if r["split"] == "train"]

    first = run(2)
    assert [r["entropy_coeff"] for r in first] == pytest.approx([0.02, 0.04])
    for r in first:
        # On-policy, one micro-batch: the trainer's own entropy estimate is the sampler's.
        assert r["sampled_entropy"] == pytest.approx(r["approx_entropy"], rel=1e-3)
        assert math.isfinite(r["loss"])
    resumed = run(3)  # resumes from step 2's checkpoint: c continues from 0.04, not from c_0 = 0
    assert [r["step"] for r in resumed] == [1, 2, 3]
    assert resumed[-1]["entropy_coeff"] == pytest.approx(0.06)
