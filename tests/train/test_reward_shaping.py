"""DAPO's soft overlong punishment pinned to hand-worked values, and through a step's advantages."""

from __future__ import annotations

import pytest
import torch

from gym_bridge.train.algorithm.reward_shaping import overlong_penalty, shape_rewards
from gym_bridge.train.batches.rollouts import Sample
from gym_bridge.train.config import ConfigError, RewardShapingConfig, load_config
from gym_bridge.train.learner.update import StepBatch


def test_penalty_is_zero_then_linear_in_the_buffer_then_capped() -> None:
    # L_max = 16, L_cache = 4: free up to 12 tokens, then (12 - |y|) / 4, -1 from 16 on (DAPO eq. 13).
    lengths = torch.tensor([10, 12, 13, 14, 16, 20])
    assert overlong_penalty(lengths, 16, 4).tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    # overlong_buffer_penalty scales it: 0.5 * -0.25 = -0.125.
    assert overlong_penalty(lengths, 16, 4, penalty=0.5)[2].item() == -0.125


def test_shape_rewards_adds_the_penalty_only_when_enabled() -> None:
    rewards, lengths = torch.tensor([1.0, 1.0]), torch.tensor([8, 15])
    on = RewardShapingConfig(enabled=True, overlong_buffer_length=4, max_response_length=16)
    assert shape_rewards(rewards, lengths, on).tolist() == [1.0, 0.25]  # 1 - (15 - 12) / 4
    assert shape_rewards(rewards, lengths, RewardShapingConfig()).tolist() == [1.0, 1.0]


def sample(reward: float, generated: int) -> Sample:
    return Sample(
        group=0, token_ids=list(range(2 + generated)), loss_mask=[0, 0] + [1] * generated, reward=reward
    )


def test_a_step_trains_on_shaped_rewards_with_the_limit_defaulting_to_max_new_tokens() -> None:
    base = ["data.train.data_path=a.jsonl", "grpo.mode=offline", "policy.generation.max_new_tokens=16"]
    cfg = load_config(
        None, [*base, "grpo.reward_shaping.enabled=true", "grpo.reward_shaping.overlong_buffer_length=4"]
    )
    assert cfg.grpo.reward_shaping.max_response_length == 16
    samples = [sample(1.0, 8), sample(1.0, 14), sample(0.0, 8), sample(0.0, 8)]
    # Shaped rewards [1, 0.5, 0, 0]; group-mean baseline 0.375, unnormalised: [.625, .125, -.375, -.375].
    overrides = ["grpo.use_leave_one_out_baseline=false", "grpo.normalize_rewards=false"]
    shaped = StepBatch.from_samples(
        load_config(
            None,
            [
                *base,
                *overrides,
                "grpo.reward_shaping.enabled=true",
                "grpo.reward_shaping.overlong_buffer_length=4",
            ],
        ).grpo,
        samples,
    )
    plain = StepBatch.from_samples(load_config(None, [*base, *overrides]).grpo, samples)
    assert shaped.advantages.tolist() == pytest.approx([0.625, 0.125, -0.375, -0.375])
    assert plain.advantages.tolist() == pytest.approx([0.5, 0.5, -0.5, -0.5])


def test_reward_shaping_keys_are_refused_when_incomplete_or_inconsistent() -> None:
    base = ["data.train.data_path=a.jsonl", "grpo.mode=offline", "policy.generation.max_new_tokens=16"]
    with pytest.raises(ConfigError, match="grpo.reward_shaping.overlong_buffer_length"):
        load_config(None, [*base, "grpo.reward_shaping.enabled=true"])
    with pytest.raises(
        ConfigError, match=r"overlong_buffer_length \(20\) must not exceed .*max_response_length \(16\)"
    ):
        load_config(
            None, [*base, "grpo.reward_shaping.enabled=true", "grpo.reward_shaping.overlong_buffer_length=20"]
        )
