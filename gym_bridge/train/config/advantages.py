"""How rewards become advantages: ``grpo.adv_estimator`` and the weights of several reward components.

A verifier may return ``reward_components`` (``{name: score}``, NeMo Gym's multi-reward shape) beside
its scalar ``reward``. Two ways to train on them:

* ``grpo.reward_weights: {name: weight}``: the training reward is ``sum_c weight_c * score_c`` (instead of
  the verifier's ``reward``), then the configured estimator as usual;
* ``grpo.adv_estimator.name: gdpo`` (NeMo RL's GDPO): each component is normalised within its prompt
  group, the normalised components are summed with weights (``grpo.reward_weights``, or NeMo RL's
  ``grpo.adv_estimator.reward_weights``; default 1 each), and the sum is normalised over the batch.
"""

from __future__ import annotations

import math

from pydantic import field_validator, model_validator

from gym_bridge.train.config.base import Section
from gym_bridge.train.registry import ADV_ESTIMATORS

__all__ = ["AdvEstimatorConfig", "check_weights", "reward_weight_problems"]


def check_weights(weights: list[float] | dict[str, float] | None, key: str) -> None:
    """Refuse (naming ``key``) an empty weight set, a non-finite weight or an empty component name."""
    if weights is None:
        return
    if not weights:
        raise ValueError(f"{key}: give at least one weight (or leave it null)")
    items = weights.items() if isinstance(weights, dict) else enumerate(weights)
    for name, weight in items:
        if isinstance(name, str) and not name:
            raise ValueError(f"{key}: a component name must not be empty")
        if not math.isfinite(weight):
            raise ValueError(f"{key}.{name}: expected a finite weight, got {weight}")


class AdvEstimatorConfig(Section):
    """How rewards become advantages (NeMo RL's ``grpo.adv_estimator``)."""

    name: str = "grpo"
    """The estimator by name, one function each (``gym_bridge/train/algorithm/advantages.py``; a new one is a
    function registered with ``gym_bridge.train.registry.register_adv_estimator``, see
    docs/guides/training.md). ``grpo``: group-relative, ``reward - baseline`` of the prompt's group (group mean, or leave-one-out
    with grpo.use_leave_one_out_baseline), divided by the group's std with grpo.normalize_rewards.
    ``reinforce_plus_plus`` (REINFORCE++, Hu 2025): ``reward - group mean`` (with minus_baseline), then
    normalised over the whole batch, ``(a - mean) / std`` with the mean and std over the batch's valid
    generated tokens (each sample weighted by its token count, as NeMo RL); like NeMo RL's, it reads
    neither grpo.normalize_rewards nor grpo.use_leave_one_out_baseline (its recipes, e.g. ProRLv2,
    leave them true). ``gdpo`` (GDPO, Liu et al. 2026; NeMo RL's ``GDPOAdvantageEstimator``): for rollouts
    whose verifier returns ``reward_components`` (two or more), each component gets the ``grpo``
    estimator's advantage within its group (same baseline and std settings, no clipping), the
    components' advantages are summed with their weights, and the sum is normalised over the step's
    samples in the loss, ``(A - mean) / std`` (std 0: only the mean is subtracted), then clipped by
    grpo.advantage_clip_low/high. NeMo RL's guide pairs it with use_leave_one_out_baseline false.
    Default grpo."""

    normalize_rewards: bool | None = None
    """NeMo RL's copy of grpo.normalize_rewards (its recipes write ``${grpo.normalize_rewards}``); null
    means that key, a different value is refused. Default null."""

    use_leave_one_out_baseline: bool | None = None
    """NeMo RL's copy of grpo.use_leave_one_out_baseline; null means that key, a different value is
    refused. Default null."""

    minus_baseline: bool = True
    """``reinforce_plus_plus`` only: subtract each prompt group's mean reward before the batch
    normalisation (REINFORCE++-baseline); false normalises the raw rewards. Refused as false with
    ``name: grpo`` or ``gdpo`` (which always subtract their group baseline). Default true."""

    reward_weights: list[float] | dict[str, float] | None = None
    """``gdpo`` only (NeMo RL's key): the weight of each reward component in the sum of their
    normalised advantages. NeMo RL's form is a list, one weight per component in alphabetical order of
    the component names (its length must match the step's components); a ``{name: weight}`` mapping
    is also accepted and means the same as grpo.reward_weights. Null: weight 1 each (or
    grpo.reward_weights). Default null."""

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        ADV_ESTIMATORS.get(name)  # refuses an unknown name, listing the registered ones
        return name

    @property
    def takes_components(self) -> bool:
        """Whether the estimator works on the (b, k) reward components (GDPO) instead of one reward each."""
        return bool(ADV_ESTIMATORS.get(self.name).traits["components"])

    def _reads(self, key: str) -> bool:
        return key in ADV_ESTIMATORS.get(self.name).traits["reads"]

    @model_validator(mode="after")
    def _settings_fit_the_estimator(self) -> AdvEstimatorConfig:
        if not self.minus_baseline and not self._reads("minus_baseline"):
            raise ValueError(
                f"grpo.adv_estimator.minus_baseline=false applies to name {_readers('minus_baseline')}; "
                f"the {self.name!r} estimator does not read it"
            )
        if self.reward_weights is not None and not self._reads("reward_weights"):
            raise ValueError(
                f"grpo.adv_estimator.reward_weights applies to name {_readers('reward_weights')} (got "
                f"{self.name!r}); to weight reward components into the training reward with this estimator, "
                "set grpo.reward_weights"
            )
        check_weights(self.reward_weights, "grpo.adv_estimator.reward_weights")
        return self


def _readers(key: str) -> str:
    """The registered estimators that read ``grpo.adv_estimator.<key>``, for messages."""
    return " or ".join(repr(name) for name in ADV_ESTIMATORS.having(lambda traits: key in traits["reads"]))


def reward_weight_problems(
    reward_weights: dict[str, float] | None, estimator: AdvEstimatorConfig, shaping_enabled: bool
) -> list[str]:
    """Contradictions between grpo.reward_weights, grpo.adv_estimator and grpo.reward_shaping."""
    problems = []
    if reward_weights is not None and estimator.reward_weights is not None:
        problems.append(
            "grpo.reward_weights and grpo.adv_estimator.reward_weights both give component weights; "
            "set one of them"
        )
    if shaping_enabled and estimator.takes_components:
        problems.append(
            f"grpo.reward_shaping.enabled contradicts grpo.adv_estimator.name {estimator.name!r}: DAPO's length "
            "penalty shapes the scalar reward, which that estimator does not use (its advantages come from "
            "reward_components)"
        )
    return problems
