"""Per-task numbers and GRPO advantages, from the project's own implementations.

The per-task summary is :func:`gym_bridge.records.metrics.aggregate_rewards` over the task's rollouts (so a task's
pass@k and majority@k are the ones ``collect`` and the servers' ``/aggregate_metrics`` report, with k
the task's number of rollouts). Advantages are :func:`gym_bridge.train.algorithm.advantages.compute_advantages`
with the trainer's defaults (leave-one-out baseline, std normalisation): torch is imported on first use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gym_bridge.records.metrics import aggregate_rewards, pass_at_k

__all__ = ["ADVANTAGE_SETTINGS", "SUCCESS_THRESHOLD", "group_advantages", "pass_at_k", "task_summary"]

SUCCESS_THRESHOLD = 1.0
"""A rollout counts as correct at ``reward >= 1.0``, as in :func:`gym_bridge.records.metrics.aggregate_rewards`."""
ADVANTAGE_SETTINGS = {"leave_one_out_baseline": True, "normalize_rewards": True}
"""The ``grpo`` defaults (``use_leave_one_out_baseline``, ``normalize_rewards``) the advantages use."""


def task_summary(
    rewards: Sequence[float], answers: Sequence[str | None], failures: Sequence[str | None]
) -> dict[str, Any]:
    """``aggregate_rewards`` of one task's rollouts (a missing reward, NaN, counts as 0 as it does there)."""
    records = [
        {
            "_ng_task_index": 0,
            "reward": None if math.isnan(r) else r,
            "extracted_answer": a,
            "failure_kind": f,
        }
        for r, a, f in zip(rewards, answers, failures, strict=True)
    ]
    return aggregate_rewards(records, SUCCESS_THRESHOLD)


def group_advantages(rewards: Sequence[float]) -> list[float] | None:
    """GRPO advantages of one group's rewards (missing rewards count as 0); None without torch."""
    try:
        import torch

        from gym_bridge.train.algorithm.advantages import compute_advantages
    except ImportError:
        return None
    values = torch.tensor([0.0 if math.isnan(r) else float(r) for r in rewards], dtype=torch.float64)
    group = torch.zeros(len(values), dtype=torch.long)
    return compute_advantages(values, group, **ADVANTAGE_SETTINGS).tolist()
