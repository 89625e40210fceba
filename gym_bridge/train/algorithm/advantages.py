"""Group-relative advantages and the dynamic-sampling filter, computed exactly as NeMo RL does.

GRPO scores each completion against the other completions of the same prompt. Samples are grouped
by ``prompt_ids``: either a ``(b,)`` tensor of integer group ids or ``(b, s)`` prompt token rows
(equal rows share a group, as NeMo RL passes them). Groups may differ in size (offline data) and
need not be contiguous.

NeMo RL's semantics (``calculate_baseline_and_std_per_prompt`` in ``nemo_rl/algorithms/utils.py``
and ``GRPOAdvantageEstimator``):

- baseline: the mean reward of the group's valid samples, or with ``leave_one_out`` the mean of
  the *other* valid samples (RLOO);
- std: the Bessel-corrected std of the same samples (for leave-one-out, of the other samples);
  an undefined std (too few samples) is 0;
- a group with at most one valid sample gets baseline = reward, i.e. advantage 0;
- normalisation divides by ``std + 1e-6`` only where ``std > 0``: groups whose rewards are all
  equal are left unscaled (their advantages are 0 anyway);
- optional clipping of the normalised advantages to ``[clip_low, clip_high]``.

``grpo.adv_estimator.name: reinforce_plus_plus`` (REINFORCE++, Hu 2025; NeMo RL's
``ReinforcePlusPlusAdvantageEstimator``) replaces the per-group std by one normalisation over the
batch: ``a_i = r_i - mean(group)`` (or ``r_i`` without ``minus_baseline``), then
``(a_i - mu) / sqrt(max(var, 1e-8))`` with mu and var over the batch's valid generated tokens, so
each sample counts once per token it generated (NeMo RL broadcasts to tokens before the statistics).

``grpo.adv_estimator.name: gdpo`` (GDPO, Liu et al. 2026; NeMo RL's ``GDPOAdvantageEstimator``) works on
several reward components ``r_k`` per sample: ``A_k`` is the ``grpo`` advantage of component k alone
(same baseline, same std normalisation, no clipping), ``A = sum_k w_k A_k``, and the result is
``(A - mean(A)) / std(A)`` over the batch's valid samples (Bessel std; when it is 0 only the mean is
subtracted, as NeMo RL). Two samples with the same total but another mix of components, say (1, 0)
and (0, 1), get one advantage under ``grpo`` on the sum and two under ``gdpo``.

Each estimator is one function of :class:`AdvantageInputs` and the ``grpo`` section, registered
under its config name in :data:`gym_bridge.train.registry.ADV_ESTIMATORS` (the ones below, by
``module:function``); :func:`estimate_advantages` looks the name up and applies
grpo.advantage_clip_low/high to whichever it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from gym_bridge.train.registry import ADV_ESTIMATORS

if TYPE_CHECKING:
    from gym_bridge.train.config import GRPOConfig

__all__ = [
    "AdvantageInputs",
    "baseline_and_std_per_prompt",
    "compute_advantages",
    "estimate_advantages",
    "gdpo_advantages",
    "grpo_advantages",
    "group_ids",
    "reinforce_plus_plus_advantages",
    "groups_with_variance",
    "samples_in_groups_with_variance",
]

NORMALIZATION_EPSILON = 1e-6
BATCH_VARIANCE_FLOOR = 1e-8
"""REINFORCE++'s batch variance is clamped to at least this before the inverse square root (NeMo RL)."""


def group_ids(prompt_ids: torch.Tensor) -> torch.Tensor:
    """Dense group index ``0..n_groups-1`` per sample from ``(b,)`` ids or ``(b, s)`` prompt rows."""
    if prompt_ids.dim() == 1:
        return torch.unique(prompt_ids, return_inverse=True)[1]
    if prompt_ids.dim() == 2:
        return torch.unique(prompt_ids, dim=0, return_inverse=True)[1]
    raise ValueError(f"prompt_ids must be (b,) ids or (b, s) rows, got shape {tuple(prompt_ids.shape)}")


def baseline_and_std_per_prompt(
    prompt_ids: torch.Tensor,
    rewards: torch.Tensor,
    valid_mask: torch.Tensor | None = None,
    leave_one_out: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample baseline and reward std, NeMo RL's ``calculate_baseline_and_std_per_prompt``.

    ``valid_mask`` (b,) of 0/1 keeps samples out of their siblings' statistics (default: all valid).
    Uses a (b, b) same-group matrix, like NeMo RL's per-group matmul, so the arithmetic (and hence
    which stds come out exactly 0) is the same; fine for GRPO batch sizes.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (b,), got shape {tuple(rewards.shape)}")
    ids = group_ids(prompt_ids.to(rewards.device))
    if ids.shape[0] != rewards.shape[0]:
        raise ValueError(f"prompt_ids has {ids.shape[0]} samples but rewards has {rewards.shape[0]}")
    valid = torch.ones_like(rewards) if valid_mask is None else valid_mask.to(rewards)
    same_group = (ids.unsqueeze(0) == ids.unsqueeze(1)).to(rewards)
    if leave_one_out:
        same_group = same_group * (1 - torch.eye(len(rewards), dtype=rewards.dtype, device=rewards.device))
    valid_in_group = (ids.unsqueeze(0) == ids.unsqueeze(1)).to(rewards) @ valid
    num = valid_in_group - int(leave_one_out)
    baseline = same_group @ (rewards * valid) / num
    baseline_sq = same_group @ (torch.pow(rewards, 2) * valid) / num
    std = ((baseline_sq - baseline.square()) * (num / (num - 1))).sqrt().nan_to_num(0)
    too_few = valid_in_group <= 1  # no valid sibling: baseline = reward makes the advantage 0
    baseline = torch.where(too_few, rewards, baseline)
    std = torch.where(too_few, torch.zeros_like(std), std)
    return baseline, std


def compute_advantages(
    rewards: torch.Tensor,
    prompt_ids: torch.Tensor,
    *,
    valid_mask: torch.Tensor | None = None,
    leave_one_out_baseline: bool = True,
    normalize_rewards: bool = True,
    clip_low: float | None = None,
    clip_high: float | None = None,
) -> torch.Tensor:
    """Per-sample GRPO advantages (b,): ``(reward - baseline) / (std + 1e-6)`` where std > 0, clipped.

    Broadcast to tokens with ``advantages[:, None]`` (the loss accepts (b,) directly).
    """
    baseline, std = baseline_and_std_per_prompt(prompt_ids, rewards, valid_mask, leave_one_out_baseline)
    advantages = rewards - baseline
    if normalize_rewards:
        nonzero = std > 0  # don't sharpen groups with no variation
        advantages = torch.where(nonzero, advantages / (std + NORMALIZATION_EPSILON), advantages)
    if clip_low is not None or clip_high is not None:
        advantages = advantages.clamp(min=clip_low, max=clip_high)
    return advantages


def reinforce_plus_plus_advantages(
    rewards: torch.Tensor,
    prompt_ids: torch.Tensor,
    *,
    valid_mask: torch.Tensor | None = None,
    token_counts: torch.Tensor | None = None,
    minus_baseline: bool = True,
) -> torch.Tensor:
    """REINFORCE++ advantages (b,): group-mean baseline, then one normalisation over the whole batch.

    ``token_counts`` (b,) weights each sample in the batch mean and variance by its generated tokens
    (default 1 each); samples outside ``valid_mask`` have weight 0 and advantage 0.
    """
    valid = torch.ones_like(rewards) if valid_mask is None else valid_mask.to(rewards)
    if minus_baseline:
        baseline, _ = baseline_and_std_per_prompt(prompt_ids, rewards, valid, leave_one_out=False)
        advantages = rewards - baseline
    else:
        advantages = rewards.clone()
    weights = valid if token_counts is None else valid * token_counts.to(rewards)
    total = weights.sum()
    if total <= 0:
        return torch.zeros_like(rewards)
    mean = (advantages * weights).sum() / total
    variance = ((advantages - mean).square() * weights).sum() / total
    return (advantages - mean) * variance.clamp(min=BATCH_VARIANCE_FLOOR).rsqrt() * (valid > 0)


def gdpo_advantages(
    components: torch.Tensor,
    prompt_ids: torch.Tensor,
    weights: torch.Tensor | None = None,
    *,
    valid_mask: torch.Tensor | None = None,
    leave_one_out_baseline: bool = True,
    normalize_rewards: bool = True,
) -> torch.Tensor:
    """GDPO advantages (b,) of a (b, k) matrix of reward components: each normalised within its group,
    summed with ``weights`` (k,) (default 1 each), the sum normalised over the valid samples.

    Samples outside ``valid_mask`` take no part in any statistic and get advantage 0.
    """
    if components.dim() != 2:
        raise ValueError(f"components must be (b, k), got shape {tuple(components.shape)}")
    valid = torch.ones(components.shape[0], dtype=components.dtype) if valid_mask is None else valid_mask
    valid = valid.to(components)
    w = torch.ones(components.shape[1], dtype=components.dtype) if weights is None else weights.to(components)
    per_component = torch.stack(
        [
            compute_advantages(
                components[:, k],
                prompt_ids,
                valid_mask=valid,
                leave_one_out_baseline=leave_one_out_baseline,
                normalize_rewards=normalize_rewards,
            )
            for k in range(components.shape[1])
        ],
        dim=1,
    )
    combined = per_component @ w
    kept = combined[valid > 0]
    if kept.numel() == 0:
        return torch.zeros_like(combined)
    centred = combined - kept.mean()
    std = kept.std() if kept.numel() > 1 else torch.zeros((), dtype=combined.dtype)
    if std > 0:
        centred = centred / std
    return centred * (valid > 0)


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator may read about a step's samples (b of them)."""

    rewards: torch.Tensor
    """(b,) training rewards: the verifier's, or grpo.reward_weights' sum, after grpo.reward_shaping."""
    prompt_ids: torch.Tensor
    """(b,) group ids or (b, s) prompt rows (:func:`group_ids`)."""
    valid_mask: torch.Tensor | None = None
    """(b,) 1 for samples in the statistics; None: all."""
    token_counts: torch.Tensor | None = None
    """(b,) generated tokens per sample."""
    components: torch.Tensor | None = None
    """(b, k) reward components, for an estimator registered with ``components=True``."""
    component_weights: torch.Tensor | None = None
    """(k,) their weights; None: 1 each."""


def estimate_advantages(batch: AdvantageInputs, cfg: GRPOConfig) -> torch.Tensor:
    """The advantages (b,) of the estimator ``grpo.adv_estimator.name`` names, clipped to
    ``[grpo.advantage_clip_low, grpo.advantage_clip_high]``."""
    estimator = ADV_ESTIMATORS.get(cfg.adv_estimator.name)
    if estimator.traits["components"] and batch.components is None:
        raise ValueError(f"grpo.adv_estimator.name {estimator.name!r} needs the samples' reward components")
    advantages = estimator.fn(batch, cfg)
    if cfg.advantage_clip_low is not None or cfg.advantage_clip_high is not None:
        advantages = advantages.clamp(min=cfg.advantage_clip_low, max=cfg.advantage_clip_high)
    return advantages


def grpo_advantages(
    rewards: torch.Tensor,
    prompt_ids: torch.Tensor,
    cfg: GRPOConfig,
    valid_mask: torch.Tensor | None = None,
    token_counts: torch.Tensor | None = None,
    components: torch.Tensor | None = None,
    component_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """The advantages a ``grpo`` config section asks for (:func:`estimate_advantages`), from tensors.

    ``token_counts`` (b,): generated tokens per sample, for REINFORCE++'s token-weighted statistics.
    ``components`` (b, k) and ``component_weights`` (k,): the reward components GDPO uses (``rewards``
    is then not read); :mod:`gym_bridge.train.algorithm.reward_components` builds them from the rollouts.
    """
    inputs = AdvantageInputs(rewards, prompt_ids, valid_mask, token_counts, components, component_weights)
    return estimate_advantages(inputs, cfg)


# ------------------------------------------------------------------ the estimators (registry.py names them)


def grpo_estimator(batch: AdvantageInputs, cfg: GRPOConfig) -> torch.Tensor:
    """GRPO: ``A_i = (r_i - b_i) / (std_i + 1e-6)`` where ``std_i > 0``, else ``r_i - b_i``; ``b_i`` and
    ``std_i`` over the valid samples of i's group (leave-one-out: over the *others*,
    grpo.use_leave_one_out_baseline), no division with grpo.normalize_rewards false."""
    return compute_advantages(
        batch.rewards,
        batch.prompt_ids,
        valid_mask=batch.valid_mask,
        leave_one_out_baseline=cfg.use_leave_one_out_baseline,
        normalize_rewards=cfg.normalize_rewards,
    )


def reinforce_plus_plus_estimator(batch: AdvantageInputs, cfg: GRPOConfig) -> torch.Tensor:
    """REINFORCE++: ``a_i = r_i - mean(group)`` (``r_i`` with minus_baseline false), then
    ``(a_i - mu) / sqrt(max(var, 1e-8))``, mu and var over the batch's valid generated tokens."""
    return reinforce_plus_plus_advantages(
        batch.rewards,
        batch.prompt_ids,
        valid_mask=batch.valid_mask,
        token_counts=batch.token_counts,
        minus_baseline=cfg.adv_estimator.minus_baseline,
    )


def gdpo_estimator(batch: AdvantageInputs, cfg: GRPOConfig) -> torch.Tensor:
    """GDPO: ``A = sum_k w_k A_k`` with ``A_k`` the ``grpo`` advantage of component k alone, then
    ``(A - mean(A)) / std(A)`` over the valid samples (only ``- mean`` when the std is 0)."""
    return gdpo_advantages(
        batch.components,
        batch.prompt_ids,
        batch.component_weights,
        valid_mask=batch.valid_mask,
        leave_one_out_baseline=cfg.use_leave_one_out_baseline,
        normalize_rewards=cfg.normalize_rewards,
    )


# ------------------------------------------------------------------ dynamic sampling


def groups_with_variance(grouped_rewards: torch.Tensor) -> torch.Tensor:
    """Bool (P,): which rows of a (P, G) reward matrix are not all equal (dynamic sampling keeps them)."""
    if grouped_rewards.dim() != 2:
        raise ValueError(f"grouped_rewards must be (P, G), got shape {tuple(grouped_rewards.shape)}")
    return grouped_rewards.amax(dim=1) != grouped_rewards.amin(dim=1)


def samples_in_groups_with_variance(
    rewards: torch.Tensor,
    prompt_ids: torch.Tensor,
    valid_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Bool (b,): samples whose group's valid rewards are not all equal (DAPO dynamic sampling).

    A group with zero reward variance gives every sample advantage 0, so it carries no learning
    signal; dynamic sampling drops such groups and generates more. Groups with fewer than two
    valid samples count as having no variance.
    """
    ids = group_ids(prompt_ids.to(rewards.device))
    n_groups = int(ids.max()) + 1 if len(ids) else 0
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid_mask is None else valid_mask.bool()
    high = torch.full((n_groups,), -torch.inf, dtype=rewards.dtype, device=rewards.device)
    low = torch.full((n_groups,), torch.inf, dtype=rewards.dtype, device=rewards.device)
    high = high.scatter_reduce(0, ids, torch.where(valid, rewards, -torch.inf), reduce="amax")
    low = low.scatter_reduce(0, ids, torch.where(valid, rewards, torch.inf), reduce="amin")
    informative = torch.isfinite(high) & (high != low)
    return informative[ids]
