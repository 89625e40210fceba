"""A step's reward components (``reward_components`` of ``/verify``) as the tensors the advantages use.

``grpo.reward_weights`` turns them into one training reward per sample (``sum weight * score``);
GDPO (``grpo.adv_estimator.name: gdpo``) takes them as a (b, k) matrix with one weight per column.

Which components a sample has, decided here:

* a component a whole prompt group lacks counts 0 for that group: a constant within a group moves
  no group-relative advantage (GDPO's per-component advantage of it is 0), so mixing environments
  with different components in one step is sound (NeMo RL fills 0 as well);
* a component only some rollouts of a group carry is an error naming it: a 0 filled in there would
  enter the group's baseline and std as a real score (NeMo RL fills it silently);
* a group with none of the components, and a component that ``grpo.reward_weights`` does not weigh,
  are errors: training would otherwise quietly ignore what the verifier said;
* samples kept out of the loss (``mask_sample``) are not checked and take no part in the statistics.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from gym_bridge.train.algorithm.advantages import samples_in_groups_with_variance
from gym_bridge.train.batches.rollouts import Sample

__all__ = [
    "RewardComponentError",
    "component_matrix",
    "components_of",
    "gdpo_components",
    "informative_samples",
    "training_rewards",
    "uses_components",
]


class RewardComponentError(ValueError):
    """The step's rollouts do not carry the reward components the config trains on."""


def uses_components(grpo: Any) -> bool:
    """Whether the advantages come from reward components (``grpo.reward_weights`` or GDPO)."""
    return grpo.reward_weights is not None or grpo.adv_estimator.takes_components


def components_of(sample: Sample) -> dict[str, float] | None:
    """The sample's reward components: its own field, else its rollout record's ``reward_components``."""
    if sample.reward_components is not None:
        return sample.reward_components
    found = (sample.record or {}).get("reward_components")
    return found if isinstance(found, dict) else None


def _where(sample: Sample) -> str:
    return f"task {sample.task_name!r} (group {sample.group})" if sample.task_name else f"group {sample.group}"


def _step_names(samples: Sequence[Sample]) -> list[str]:
    return sorted({name for s in samples if not s.masked for name in components_of(s) or {}})


def component_matrix(samples: Sequence[Sample], names: Sequence[str], key: str) -> torch.Tensor:
    """(b, k) float32 scores of ``names`` per sample, checked as the module says; ``key`` names the
    config key that asked for them in errors."""
    by_group: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        if not s.masked:
            by_group[s.group].append(s)
    for members in by_group.values():
        carried = [set(components_of(s) or {}) for s in members]
        for name in names:
            having = sum(name in c for c in carried)
            if 0 < having < len(members):
                raise RewardComponentError(
                    f"{key}: reward component {name!r} is missing from {len(members) - having} of the "
                    f"{len(members)} rollouts of {_where(members[0])}; a verifier must return the same "
                    "components for every rollout of a task"
                )
        if not any(name in carried[0] for name in names):
            raise RewardComponentError(
                f"{key}: the rollouts of {_where(members[0])} carry none of the reward components "
                f"{list(names)} (their /verify answers have reward_components {sorted(carried[0])})"
            )
    return torch.tensor(
        [[float((components_of(s) or {}).get(name, 0.0)) for name in names] for s in samples],
        dtype=torch.float32,
    ).reshape(len(samples), len(names))


def _weighted_names(samples: Sequence[Sample], weights: dict[str, float], key: str) -> list[str]:
    unweighted = [name for name in _step_names(samples) if name not in weights]
    if unweighted:
        raise RewardComponentError(
            f"{key}: reward component {unweighted[0]!r} (returned by the verifier) has no weight; "
            f"give it one (0 ignores it). Weighted: {sorted(weights)}"
        )
    return sorted(weights)


def training_rewards(samples: Sequence[Sample], grpo: Any) -> torch.Tensor:
    """(b,) rewards the grpo and reinforce_plus_plus estimators train on: ``sum weight * score`` with
    ``grpo.reward_weights``, else each sample's verifier ``reward``."""
    weights = grpo.reward_weights
    if weights is None:
        return torch.tensor([s.reward for s in samples], dtype=torch.float32)
    names = _weighted_names(samples, weights, "grpo.reward_weights")
    matrix = component_matrix(samples, names, "grpo.reward_weights")
    return matrix @ torch.tensor([weights[n] for n in names], dtype=torch.float32)


def gdpo_components(samples: Sequence[Sample], grpo: Any) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """GDPO's (b, k) component matrix, its (k,) weights and the component names (alphabetical, NeMo
    RL's order). Weights: grpo.reward_weights or adv_estimator.reward_weights by name, a list of
    adv_estimator.reward_weights in name order, or 1 each."""
    mapping = grpo.reward_weights
    listed = grpo.adv_estimator.reward_weights
    key = f"grpo.adv_estimator.name {grpo.adv_estimator.name!r}"
    if isinstance(listed, dict):
        mapping = listed
    if mapping is not None:
        where = "grpo.reward_weights" if mapping is grpo.reward_weights else "grpo.adv_estimator.reward_weights"
        names = _weighted_names(samples, mapping, where)
        weights = [mapping[n] for n in names]
    else:
        names = _step_names(samples)
        weights = list(listed) if listed is not None else [1.0] * len(names)
        if len(weights) != len(names):
            raise RewardComponentError(
                f"grpo.adv_estimator.reward_weights has {len(weights)} entries but the step's rollouts have "
                f"{len(names)} reward components {names}; give one weight per component in this "
                "(alphabetical) order, or a {name: weight} mapping"
            )
    if len(names) < 2:
        raise RewardComponentError(
            f"{key} needs two or more reward components (reward_components in /verify answers); this "
            f"step's rollouts have {names or 'none'}. Use grpo.adv_estimator.name 'grpo' for one reward"
        )
    matrix = component_matrix(samples, names, key)
    return matrix, torch.tensor(weights, dtype=torch.float32), names


def informative_samples(samples: Sequence[Sample], grpo: Any) -> list[bool]:
    """Which samples are in a group with a learning signal (DAPO dynamic sampling keeps those groups):
    the rewards the advantages use differ within the group; with GDPO, any one component differs."""
    if grpo.adv_estimator.takes_components:
        columns = gdpo_components(samples, grpo)[0].T
    else:
        columns = training_rewards(samples, grpo).unsqueeze(0)
    groups = torch.tensor([s.group for s in samples])
    valid = torch.tensor([float(not s.masked) for s in samples])
    keep = torch.zeros(len(samples), dtype=torch.bool)
    for column in columns:
        keep |= samples_in_groups_with_variance(column, groups, valid)
    return keep.tolist()
