"""Several reward components: GDPO's formula and grpo.reward_weights pinned to hand-computed values,
the rules for missing components, dynamic sampling, the config's refusals, and both keys changing a
real training step (``build_learner`` + ``StepBatch.from_samples`` + ``update_policy``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from gym_bridge.train.algorithm.advantages import compute_advantages, gdpo_advantages
from gym_bridge.train.algorithm.reward_components import (
    RewardComponentError,
    gdpo_components,
    informative_samples,
    training_rewards,
)
from gym_bridge.train.batches.rollouts import Sample
from gym_bridge.train.bookkeeping.metrics import sample_metrics
from gym_bridge.train.config import ConfigError, load_config
from tests.train.helpers import one_trainer_step, save_random_tiny, step_sample

OFFLINE = ["data.train.data_path=unused.jsonl", "grpo.mode=offline"]


def grpo_cfg(*overrides: str):
    return load_config(None, [*OFFLINE, *overrides]).grpo


def sample(group: int, components: dict[str, float] | None, reward: float = 0.0, **kw) -> Sample:
    return Sample(group=group, token_ids=[1, 2, 3], loss_mask=[0, 1, 1], reward=reward,
                  reward_components=components, task_name=kw.pop("task_name", "t"), **kw)  # fmt: skip


# --------------------------------------------------------------------------- GDPO's formula


def test_gdpo_normalises_each_component_in_its_group_then_the_weighted_sum_over_the_batch() -> None:
    # One group of four; correct = (1,0,0,0): mean 1/4, Bessel std 1/2 -> A1 = (3/2, -1/2, -1/2, -1/2);
    # format = (1,1,0,0): mean 1/2, std sqrt(1/3) -> A2 = (s, s, -s, -s) with s = sqrt(3)/2.
    # A = A1 + A2 = (2.3660254, 0.3660254, -1.3660254, -1.3660254): mean 0, Bessel std
    # sqrt((5.5980762 + 0.1339746 + 2 * 1.8660254) / 3) = 1.7761476.
    components = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    got = gdpo_advantages(components, torch.zeros(4), leave_one_out_baseline=False)
    assert got.tolist() == pytest.approx([1.332106, 0.206079, -0.769093, -0.769093], abs=1e-5)
    # GRPO on the summed reward (2, 1, 0, 0) differs: deviations (1.25, .25, -.75, -.75) / 0.957427.
    summed = compute_advantages(components.sum(1), torch.zeros(4), leave_one_out_baseline=False)
    assert summed.tolist() == pytest.approx([1.305582, 0.261116, -0.783349, -0.783349], abs=1e-5)


def test_gdpo_weights_tell_apart_two_mixes_with_the_same_total() -> None:
    # (1,0), (0,1), (1,1), (0,0): per component +-a with a = sqrt(3)/2 (mean 1/2, std sqrt(1/3)).
    components = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    equal = gdpo_advantages(components, torch.zeros(4), leave_one_out_baseline=False)
    # sum (0, 0, 2a, -2a): Bessel std 2a sqrt(2/3) -> (0, 0, sqrt(3/2), -sqrt(3/2)); (1,0) ties (0,1)
    assert equal.tolist() == pytest.approx([0.0, 0.0, math.sqrt(1.5), -math.sqrt(1.5)], abs=1e-5)
    # weights (1, 1/2): sum (a/2, -a/2, 3a/2, -3a/2), std a sqrt(5/3) -> (1, -1, 3, -3) * sqrt(15) / 10
    weighted = gdpo_advantages(components, torch.zeros(4), torch.tensor([1.0, 0.5]), leave_one_out_baseline=False)
    root = math.sqrt(15) / 10
    assert weighted.tolist() == pytest.approx([root, -root, 3 * root, -3 * root], abs=1e-5)


def test_gdpo_leaves_masked_samples_out_and_a_tied_batch_at_zero() -> None:
    components = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [9.0, -9.0]])
    valid = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0])
    got = gdpo_advantages(components, torch.zeros(5), valid_mask=valid, leave_one_out_baseline=False)
    assert got.tolist() == pytest.approx([1.332106, 0.206079, -0.769093, -0.769093, 0.0], abs=1e-5)
    tied = gdpo_advantages(torch.ones(4, 2), torch.tensor([0, 0, 1, 1]))
    assert tied.tolist() == [0.0, 0.0, 0.0, 0.0]


# --------------------------------------------------------------------------- grpo.reward_weights


def test_reward_weights_make_the_training_reward_and_a_group_without_a_component_counts_zero() -> None:
    cfg = grpo_cfg("grpo.reward_weights={correct: 1.0, format: 0.25, tests: 2.0}")
    samples = [
        sample(0, {"correct": 1.0, "format": 1.0}, reward=2.0),  # math rollouts: no 'tests' -> 0 there
        sample(0, {"correct": 0.0, "format": 1.0}, reward=1.0),
        sample(1, {"tests": 0.5}, reward=0.0),  # code rollouts: only 'tests'
        sample(1, {"tests": 1.0}, reward=1.0),
    ]
    assert training_rewards(samples, cfg).tolist() == [1.25, 0.25, 1.0, 2.0]
    assert training_rewards(samples, grpo_cfg()).tolist() == [2.0, 1.0, 0.0, 1.0]  # no weights: reward


@pytest.mark.parametrize(
    "samples, message",
    [
        ([sample(0, {"correct": 1.0, "format": 1.0}), sample(0, {"correct": 0.0})],
         "reward component 'format' is missing from 1 of the 2 rollouts of task 't' (group 0)"),
        ([sample(0, {"correct": 1.0, "style": 1.0}), sample(0, {"correct": 0.0, "style": 0.0})],
         "reward component 'style' (returned by the verifier) has no weight; give it one (0 ignores it)"),
        ([sample(0, None, reward=1.0), sample(0, None)],
         "the rollouts of task 't' (group 0) carry none of the reward components ['correct', 'format']"),
    ],
)  # fmt: skip
def test_missing_or_unweighted_components_are_errors_naming_them(samples: list[Sample], message: str) -> None:
    cfg = grpo_cfg("grpo.reward_weights={correct: 1.0, format: 0.5}")
    with pytest.raises(RewardComponentError) as err:
        training_rewards(samples, cfg)
    assert str(err.value).startswith("grpo.reward_weights: ") and message in str(err.value)


def test_a_masked_sample_is_not_checked() -> None:
    cfg = grpo_cfg("grpo.reward_weights={correct: 1.0}")
    samples = [sample(0, {"correct": 1.0}), sample(0, {"correct": 0.0}), sample(0, None, masked=True)]
    assert training_rewards(samples, cfg).tolist() == [1.0, 0.0, 0.0]


# --------------------------------------------------------------------------- GDPO's components and weights


def test_gdpo_weights_as_nemo_rl_lists_them_follow_the_alphabetical_component_order() -> None:
    samples = [sample(0, {"format": 1.0, "correct": 0.0}), sample(0, {"format": 0.0, "correct": 1.0})]
    matrix, weights, names = gdpo_components(
        samples, grpo_cfg("grpo.adv_estimator.name=gdpo", "grpo.adv_estimator.reward_weights=[2.0, 0.5]")
    )
    assert names == ["correct", "format"] and weights.tolist() == [2.0, 0.5]
    assert matrix.tolist() == [[0.0, 1.0], [1.0, 0.0]]
    for key in ("grpo.reward_weights", "grpo.adv_estimator.reward_weights"):
        by_name = gdpo_components(samples, grpo_cfg("grpo.adv_estimator.name=gdpo", f"{key}={{format: 3, correct: 1}}"))
        assert by_name[2] == ["correct", "format"] and by_name[1].tolist() == [1.0, 3.0]
        with pytest.raises(RewardComponentError, match=f"^{key}: reward component 'correct' .* has no weight"):
            gdpo_components(samples, grpo_cfg("grpo.adv_estimator.name=gdpo", f"{key}={{format: 3}}"))


def test_gdpo_refuses_one_component_and_a_weight_list_of_the_wrong_length() -> None:
    one = [sample(0, {"correct": 1.0}), sample(0, {"correct": 0.0})]
    with pytest.raises(RewardComponentError, match=r"needs two or more reward components .* \['correct'\]"):
        gdpo_components(one, grpo_cfg("grpo.adv_estimator.name=gdpo"))
    two = [sample(0, {"correct": 1.0, "format": 0.0}), sample(0, {"correct": 0.0, "format": 1.0})]
    with pytest.raises(RewardComponentError, match=r"reward_weights has 3 entries but .* 2 reward components"):
        gdpo_components(two, grpo_cfg("grpo.adv_estimator.name=gdpo", "grpo.adv_estimator.reward_weights=[1,1,1]"))


def test_dynamic_sampling_keeps_a_group_whose_totals_tie_when_gdpo_sees_its_components_differ() -> None:
    samples = [
        sample(0, {"correct": 1.0, "format": 0.0}, reward=1.0),
        sample(0, {"correct": 0.0, "format": 1.0}, reward=1.0),
        sample(1, {"correct": 1.0, "format": 1.0}, reward=2.0),
        sample(1, {"correct": 1.0, "format": 1.0}, reward=2.0),
    ]
    assert informative_samples(samples, grpo_cfg()) == [False] * 4
    assert informative_samples(samples, grpo_cfg("grpo.adv_estimator.name=gdpo")) == [True, True, False, False]
    weighted = grpo_cfg("grpo.reward_weights={correct: 1.0, format: 0.5}")
    assert informative_samples(samples, weighted) == [True, True, False, False]


def test_step_metrics_carry_a_mean_per_component() -> None:
    samples = [sample(0, {"correct": 1.0, "format": 1.0}), sample(0, {"correct": 0.0, "format": 1.0}),
               sample(1, {"tests": 0.25})]  # fmt: skip
    metrics = sample_metrics(samples, torch.zeros(3))
    assert metrics["reward_component/correct_mean"] == 0.5
    assert metrics["reward_component/format_mean"] == 1.0 and metrics["reward_component/tests_mean"] == 0.25


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["grpo.reward_weights={a: 1}", "grpo.adv_estimator.name=gdpo", "grpo.adv_estimator.reward_weights=[1, 2]"],
         "grpo.reward_weights and grpo.adv_estimator.reward_weights both give component weights"),
        (["grpo.adv_estimator.reward_weights=[1, 2]"],
         "grpo.adv_estimator.reward_weights applies to name 'gdpo' (got 'grpo')"),
        (["grpo.adv_estimator.name=gdpo", "grpo.reward_shaping.enabled=true",
          "grpo.reward_shaping.overlong_buffer_length=2"],
         "grpo.reward_shaping.enabled contradicts grpo.adv_estimator.name 'gdpo'"),
        (["grpo.adv_estimator.name=gdpo", "grpo.adv_estimator.minus_baseline=false"],
         "grpo.adv_estimator.minus_baseline=false applies to name 'reinforce_plus_plus'"),
        (["grpo.reward_weights={correct: .inf}"], "grpo.reward_weights.correct: expected a finite weight"),
        (["grpo.reward_weights={}"], "grpo.reward_weights: give at least one weight"),
    ],
)  # fmt: skip
def test_contradictory_reward_keys_are_refused_naming_them(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [*OFFLINE, *overrides])
    assert message in str(err.value)


# --------------------------------------------------------------------------- through the trainer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_components"), seed=5, num_layers=1)


def step_samples() -> list[Sample]:
    """Two groups of four; the verifier's reward is correct + format, so group 1's totals all tie."""
    mixes = [(1, 1), (0, 1), (1, 0), (0, 0), (1, 0), (0, 1), (1, 0), (0, 1)]
    return [
        step_sample(i, float(correct + fmt), {"reward_components": {"correct": float(correct), "format": float(fmt)}})
        for i, (correct, fmt) in enumerate(mixes)
    ]


def train_step(model_dir: Path, *overrides: str) -> tuple[float, torch.Tensor]:
    return one_trainer_step(model_dir, step_samples(), *overrides)


def test_reward_weights_and_gdpo_change_the_advantages_and_the_loss_of_the_same_batch(model_dir: Path) -> None:
    loss, advantages = train_step(model_dir)
    assert advantages[4:].tolist() == [0.0] * 4  # group 1's verifier rewards tie: no signal
    w_loss, weighted = train_step(model_dir, "grpo.reward_weights={correct: 1.0, format: 0.5}")
    # training rewards (1.5, .5, 1, 0 | 1, .5, 1, .5); group 1 now ranks correct over format
    expected = torch.cat(
        [
            compute_advantages(torch.tensor([1.5, 0.5, 1.0, 0.0]), torch.zeros(4)),
            compute_advantages(torch.tensor([1.0, 0.5, 1.0, 0.5]), torch.zeros(4)),
        ]
    )
    assert weighted.tolist() == pytest.approx(expected.tolist(), abs=1e-6)
    assert weighted[4] > 0 > weighted[5] and w_loss != pytest.approx(loss, rel=1e-4)
    g_loss, gdpo = train_step(model_dir, "grpo.adv_estimator.name=gdpo", "grpo.use_leave_one_out_baseline=false")
    components = torch.tensor([[1.0, 1], [0, 1], [1, 0], [0, 0], [1, 0], [0, 1], [1, 0], [0, 1]])
    pinned = gdpo_advantages(components, torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]), leave_one_out_baseline=False)
    assert gdpo.tolist() == pytest.approx(pinned.tolist(), abs=1e-6)
    assert not torch.allclose(gdpo, advantages) and g_loss != pytest.approx(loss, rel=1e-4)
    # group 1 is symmetric, (1,0) and (0,1) twice: equal weights tie them, NeMo RL's weight list does not
    assert gdpo[4:].tolist() == pytest.approx([0.0] * 4, abs=1e-6)
    _, listed = train_step(model_dir, "grpo.adv_estimator.name=gdpo", "grpo.adv_estimator.reward_weights=[1.0, 0.5]")
    assert listed[4] > 0 > listed[5]
