"""GRPO advantages pinned to hand-computed values and to an independent per-group reference."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from gym_bridge.train.algorithm.advantages import (
    baseline_and_std_per_prompt,
    compute_advantages,
    group_ids,
    groups_with_variance,
    grpo_advantages,
    reinforce_plus_plus_advantages,
    samples_in_groups_with_variance,
)
from gym_bridge.train.config import GRPOConfig

EPS = 1e-6


def t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def reference_advantages(
    rewards: list[float],
    ids: list[int],
    valid: list[int] | None = None,
    leave_one_out: bool = True,
    normalize: bool = True,
) -> list[float]:
    """NeMo RL's documented semantics for valid samples, as plain loops over each sample's group."""
    valid = valid or [1] * len(rewards)
    out = []
    for i, reward in enumerate(rewards):
        members = [j for j in range(len(rewards)) if ids[j] == ids[i]]
        valid_members = [j for j in members if valid[j]]
        if len(valid_members) <= 1:
            out.append(0.0)
            continue
        pool = [rewards[j] for j in valid_members if not (leave_one_out and j == i)]
        baseline = statistics.fmean(pool)
        spread = statistics.stdev(pool) if len(pool) >= 2 else 0.0
        advantage = reward - baseline
        if normalize and spread > 0:
            advantage /= spread + EPS
        out.append(advantage)
    return out


# ------------------------------------------------------------------------------------------ hand values


def test_group_mean_baseline_with_std_normalisation() -> None:
    adv = compute_advantages(t([1, 0, 0, 1]), torch.tensor([0, 0, 0, 0]), leave_one_out_baseline=False)
    std = math.sqrt(4 * 0.25 / 3)  # sample std of [1, 0, 0, 1] around 0.5
    expected = [0.5 / (std + EPS), -0.5 / (std + EPS), -0.5 / (std + EPS), 0.5 / (std + EPS)]
    assert adv.tolist() == pytest.approx(expected, rel=1e-12)


def test_group_mean_baseline_without_normalisation() -> None:
    adv = compute_advantages(
        t([3, 1, 2]), torch.tensor([7, 7, 7]), leave_one_out_baseline=False, normalize_rewards=False
    )
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0], abs=1e-12)


def test_leave_one_out_baseline_values() -> None:
    baseline, std = baseline_and_std_per_prompt(
        torch.tensor([0, 0, 0, 0]), t([1, 0, 0, 1]), leave_one_out=True
    )
    # For a 1: the others are [0, 0, 1]: mean 1/3, sample std sqrt((1/9 + 1/9 + 4/9) / 2).
    # For a 0: the others are [1, 0, 1]: mean 2/3, same std.
    spread = math.sqrt((1 / 9 + 1 / 9 + 4 / 9) / 2)
    assert baseline.tolist() == pytest.approx([1 / 3, 2 / 3, 2 / 3, 1 / 3], rel=1e-12)
    assert std.tolist() == pytest.approx([spread] * 4, rel=1e-12)
    adv = compute_advantages(t([1, 0, 0, 1]), torch.tensor([0, 0, 0, 0]), normalize_rewards=False)
    assert adv.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3], rel=1e-12)


def test_zero_std_groups_are_left_unscaled() -> None:
    rewards = t([1, 1, 1, 0.25, 0.25])
    ids = torch.tensor([0, 0, 0, 1, 1])
    for leave_one_out in (True, False):
        _, std = baseline_and_std_per_prompt(ids, rewards, leave_one_out=leave_one_out)
        assert std.tolist() == [0.0] * 5
        adv = compute_advantages(rewards, ids, leave_one_out_baseline=leave_one_out)
        assert adv.tolist() == [0.0] * 5 and not adv.isnan().any()


def test_leave_one_out_zero_std_is_per_sample() -> None:
    # Sample 0's siblings [0, 0] have no spread, so its advantage 1 - 0 stays unscaled;
    # samples 1 and 2 see siblings [1, 0]: mean 0.5, std sqrt(0.5).
    adv = compute_advantages(t([1, 0, 0]), torch.tensor([0, 0, 0]))
    scaled = -0.5 / (math.sqrt(0.5) + EPS)
    assert adv.tolist() == pytest.approx([1.0, scaled, scaled], rel=1e-12)


def test_two_sample_group_with_leave_one_out_has_undefined_std_treated_as_zero() -> None:
    adv = compute_advantages(t([0.9, 0.2]), torch.tensor([0, 0]))
    assert adv.tolist() == pytest.approx([0.7, -0.7], rel=1e-12)


def test_single_sample_group_gets_zero_advantage() -> None:
    rewards = t([5.0, 1.0, 0.0])
    baseline, _ = baseline_and_std_per_prompt(torch.tensor([0, 1, 1]), rewards)
    assert baseline[0].item() == 5.0
    adv = compute_advantages(rewards, torch.tensor([0, 1, 1]))
    assert adv[0].item() == 0.0


def test_invalid_samples_stay_out_of_their_siblings_statistics() -> None:
    rewards = t([1, 0, 1, 100])
    valid = torch.tensor([1, 1, 1, 0])
    adv = compute_advantages(
        rewards, torch.tensor([0, 0, 0, 0]), valid_mask=valid, leave_one_out_baseline=False
    )
    std = statistics.stdev([1, 0, 1])
    assert adv[:3].tolist() == pytest.approx(
        [(1 - 2 / 3) / (std + EPS), (0 - 2 / 3) / (std + EPS), (1 - 2 / 3) / (std + EPS)]
    )
    # A group whose only valid sample is one: everything gets advantage 0.
    adv = compute_advantages(t([1, 0]), torch.tensor([3, 3]), valid_mask=torch.tensor([1, 0]))
    assert adv.tolist() == [0.0, 0.0]


def test_advantage_clipping_after_normalisation() -> None:
    rewards = t([1, 0, 0, 0, 0])
    ids = torch.zeros(5, dtype=torch.long)
    raw = compute_advantages(rewards, ids, leave_one_out_baseline=False)
    assert raw.max().item() > 1.5 and raw.min().item() < -0.3
    clipped = compute_advantages(rewards, ids, leave_one_out_baseline=False, clip_low=-0.3, clip_high=1.5)
    assert clipped.tolist() == pytest.approx([min(max(a, -0.3), 1.5) for a in raw.tolist()])
    only_high = compute_advantages(rewards, ids, leave_one_out_baseline=False, clip_high=1.0)
    assert only_high.max().item() == 1.0 and only_high.min().item() == raw.min().item()


def test_grpo_config_drives_the_settings() -> None:
    rewards, ids = t([1, 0, 0, 1]), torch.tensor([0, 0, 0, 0])
    cfg = GRPOConfig(use_leave_one_out_baseline=False, normalize_rewards=False, advantage_clip_high=0.4)
    assert grpo_advantages(rewards, ids, cfg).tolist() == pytest.approx([0.4, -0.5, -0.5, 0.4])


# ---------------------------------------------------------------------------------------------- grouping


def test_groups_by_prompt_rows_match_groups_by_ids_and_need_not_be_contiguous() -> None:
    rows = torch.tensor([[5, 6], [7, 8], [5, 6], [7, 8], [5, 6]])
    ids = torch.tensor([10, 3, 10, 3, 10])
    assert group_ids(rows).tolist() == group_ids(torch.tensor([0, 1, 0, 1, 0])).tolist()
    rewards = t([1, 0, 0, 1, 1])
    by_rows = compute_advantages(rewards, rows)
    by_ids = compute_advantages(rewards, ids)
    assert torch.equal(by_rows, by_ids)
    assert by_ids.tolist() == pytest.approx(reference_advantages(rewards.tolist(), ids.tolist()))


@pytest.mark.parametrize("leave_one_out", [True, False])
@pytest.mark.parametrize("normalize", [True, False])
def test_matches_per_group_reference_on_random_batches(leave_one_out: bool, normalize: bool) -> None:
    rng = random.Random(1234 + leave_one_out + 2 * normalize)
    for _ in range(30):
        n = rng.randint(1, 24)
        ids = [rng.randint(0, 5) for _ in range(n)]
        rewards = [rng.choice([0.0, 1.0, 0.5, rng.random()]) for _ in range(n)]
        valid = [int(rng.random() > 0.2) for _ in range(n)]
        got = compute_advantages(
            t(rewards),
            torch.tensor(ids),
            valid_mask=torch.tensor(valid),
            leave_one_out_baseline=leave_one_out,
            normalize_rewards=normalize,
        )
        expected = reference_advantages(rewards, ids, valid, leave_one_out, normalize)
        for i in range(n):
            if valid[i]:  # invalid samples are masked out of the loss; only valid ones matter
                assert got[i].item() == pytest.approx(expected[i], rel=1e-9, abs=1e-9), (
                    rewards,
                    ids,
                    valid,
                    i,
                )


def test_float32_rewards_stay_float32_and_finite() -> None:
    rewards = torch.tensor([0.1, 0.3, 0.1, 0.3, 0.7], dtype=torch.float32)
    adv = compute_advantages(rewards, torch.tensor([0, 0, 1, 1, 2]))
    assert adv.dtype == torch.float32 and torch.isfinite(adv).all()


# ------------------------------------------------------------------------------------- dynamic sampling


def test_groups_with_variance_on_a_prompt_by_generation_matrix() -> None:
    grouped = t([[1, 1, 1], [0, 1, 0], [0, 0, 0], [0.5, 0.5, 0.25]])
    assert groups_with_variance(grouped).tolist() == [False, True, False, True]


def test_samples_in_groups_with_variance_follow_their_group() -> None:
    rewards = t([1, 1, 0, 1, 0, 0, 3])
    ids = torch.tensor([0, 0, 1, 1, 2, 2, 3])
    assert samples_in_groups_with_variance(rewards, ids).tolist() == [
        False,
        False,
        True,
        True,
        False,
        False,
        False,
    ]
    # The only differing sample of group 1 is invalid: the group carries no signal.
    valid = torch.tensor([1, 1, 1, 0, 1, 1, 1])
    assert samples_in_groups_with_variance(rewards, ids, valid).tolist() == [False] * 7


def test_dynamic_sampling_keeps_exactly_the_groups_with_nonzero_advantages() -> None:
    rewards = t([1, 1, 1, 0, 1, 0, 0.5, 0.5])
    ids = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    keep = samples_in_groups_with_variance(rewards, ids)
    adv = compute_advantages(rewards, ids)
    assert keep.tolist() == (adv != 0).tolist()


# ------------------------------------------------------------------------------------------ REINFORCE++

REWARDS_2X4 = [1, 0, 0, 1, 1, 1, 1, 0]
IDS_2X4 = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])


def test_reinforce_plus_plus_normalises_group_centred_rewards_over_the_batch() -> None:
    # Group means 0.5 and 0.75: a = [.5, -.5, -.5, .5, .25, .25, .25, -.75]. Batch mean 0,
    # variance (4 * .25 + 3 * .0625 + .5625) / 8 = 1.75 / 8 = 0.21875, std 0.4677072.
    # a / std: 0.5 -> 1.0690450, 0.25 -> 0.5345225, -0.75 -> -1.6035675.
    adv = reinforce_plus_plus_advantages(t(REWARDS_2X4), IDS_2X4)
    expected = [1.0690450, -1.0690450, -1.0690450, 1.0690450, 0.5345225, 0.5345225, 0.5345225, -1.6035675]
    assert adv.tolist() == pytest.approx(expected, rel=1e-6)
    # GRPO's per-group std gives group 1 other values: its std is 0.5 -> 0.25 / 0.5 = 0.5, -1.5.
    grpo = compute_advantages(t(REWARDS_2X4), IDS_2X4, leave_one_out_baseline=False)
    assert grpo[4].item() == pytest.approx(0.5, rel=1e-5) and adv[4].item() != pytest.approx(0.5, rel=1e-3)


def test_reinforce_plus_plus_weights_samples_by_generated_tokens() -> None:
    # Group 1's samples have 2 tokens each: mean (0 + 2 * 0) / 12 = 0; variance
    # (1 * 4 * .25 + 2 * (3 * .0625 + .5625)) / 12 = (1 + 1.5) / 12 = 0.2083333, std 0.4564355.
    counts = torch.tensor([1, 1, 1, 1, 2, 2, 2, 2])
    adv = reinforce_plus_plus_advantages(t(REWARDS_2X4), IDS_2X4, token_counts=counts)
    assert adv[0].item() == pytest.approx(0.5 / 0.4564355, rel=1e-6)  # 1.0954451
    assert adv[7].item() == pytest.approx(-0.75 / 0.4564355, rel=1e-6)


def test_reinforce_plus_plus_without_baseline_and_with_a_masked_sample() -> None:
    # No baseline: rewards mean 5/8 = 0.625, variance 5/8 * 3/8 = 0.234375, std 0.4841229:
    # 1 -> 0.375 / 0.4841229 = 0.7745967, 0 -> -0.625 / 0.4841229 = -1.2909944.
    adv = reinforce_plus_plus_advantages(t(REWARDS_2X4), IDS_2X4, minus_baseline=False)
    assert adv.tolist() == pytest.approx([0.7745967 if r else -1.2909944 for r in REWARDS_2X4], rel=1e-6)
    # A masked sample is out of the statistics and gets 0: [1, 0, 0] valid in group 0 (mean 1/3),
    # group 1 as before; a = [2/3, -1/3, -1/3, ., .25, .25, .25, -.75], mean 0 over 7,
    # variance (4/9 + 2/9 + 3 * .0625 + .5625) / 7 = 1.4166667 / 7 = 0.2023810, std 0.4498677.
    valid = t([1, 1, 1, 0, 1, 1, 1, 1])
    masked = reinforce_plus_plus_advantages(t(REWARDS_2X4), IDS_2X4, valid_mask=valid)
    assert masked[3].item() == 0.0
    assert masked[0].item() == pytest.approx((2 / 3) / 0.4498677, rel=1e-6)


def test_grpo_config_selects_the_estimator() -> None:
    cfg = GRPOConfig(adv_estimator={"name": "reinforce_plus_plus"}, advantage_clip_high=1.0)
    adv = grpo_advantages(t(REWARDS_2X4), IDS_2X4, cfg)
    assert adv.max().item() == 1.0 and adv[7].item() == pytest.approx(-1.6035675, rel=1e-6)
    plain = grpo_advantages(t(REWARDS_2X4), IDS_2X4, GRPOConfig())
    assert plain.tolist() == pytest.approx(reference_advantages(REWARDS_2X4, IDS_2X4.tolist()), rel=1e-6)


def test_adv_estimator_keys_are_refused_when_they_contradict() -> None:
    with pytest.raises(ValueError, match="grpo.adv_estimator.normalize_rewards"):
        GRPOConfig(normalize_rewards=True, adv_estimator={"normalize_rewards": False})
    with pytest.raises(ValueError, match="grpo.adv_estimator.minus_baseline"):
        GRPOConfig(adv_estimator={"minus_baseline": False})
    with pytest.raises(ValueError, match="name"):
        GRPOConfig(adv_estimator={"name": "gae"})
    GRPOConfig(use_leave_one_out_baseline=False, adv_estimator={"use_leave_one_out_baseline": False})
