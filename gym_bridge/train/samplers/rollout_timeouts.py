"""Rollout deadlines in training: how long a batch's rollouts may take, and what a timed-out one becomes.

Why: a step waits for its slowest rollout. An environment that never answers one request in forty
(a proxy that drops it, a verifier stuck on one input) made every step of the tiny recipe wait out the
env request's 60 s timeout and send the request again, ~200x its normal length, while the step line
said nothing had failed; NeMo RL's async GRPO waits for such a straggler for good (its issue 3238).
So every rollout gets a deadline for the whole of it (:attr:`gym_bridge.rollout.agent.AgentConfig.rollout_timeout_s`):
``grpo.rollout_timeout_s``, or one measured from the run's own rollouts (:class:`RolloutDeadline`).
A rollout past it is cut off, counted, and ``grpo.on_rollout_timeout`` decides its group's fate
(:mod:`gym_bridge.train.samplers.sampling` applies it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["RolloutDeadline", "is_timed_out", "zero_reward_record"]


class RolloutDeadline:
    """The deadline of each generation batch's rollouts: ``grpo.rollout_timeout_s`` when set, else
    ``rollout_timeout_factor`` x the slowest rollout of the previous batch (at least
    ``rollout_timeout_min_s``), none before a batch has been measured."""

    def __init__(self, grpo: Any) -> None:
        self.fixed: float | None = grpo.rollout_timeout_s
        self.factor: float = grpo.rollout_timeout_factor
        self.min_s: float = grpo.rollout_timeout_min_s
        self.slowest_s: float | None = None
        """The slowest rollout of the last batch that finished any in time."""

    def seconds(self) -> float | None:
        """The next batch's deadline (None: no rollout deadline, only the per-request ones)."""
        if self.fixed is not None:
            return self.fixed
        if self.slowest_s is None:
            return None
        return max(self.min_s, self.factor * self.slowest_s)

    def observe(self, durations_s: Iterable[float]) -> None:
        """Record the durations of a batch's rollouts that finished at their normal pace (never the cut-off
        ones, nor those that waited out a request timeout: a deadline measured from them would only grow)."""
        durations = list(durations_s)
        if durations:
            self.slowest_s = max(durations)


def is_timed_out(rollout: Any) -> bool:
    """Whether the agent loop cut the rollout off at its deadline."""
    return rollout.failure is not None and rollout.failure.failure_class == "rollout_timeout"


def zero_reward_record(
    row: dict[str, Any], message: str, partial_output: list[dict[str, Any]], component_names: Iterable[str]
) -> dict[str, Any]:
    """The record a timed-out rollout of task ``row`` is trained on under ``zero_reward``: what it
    generated before the deadline, reward 0, and 0 for each reward component its group's other
    rollouts carry (so the group's components stay complete); ``timed_out`` and ``failure`` say why."""
    record: dict[str, Any] = {
        **row,
        "response": {"output": partial_output},
        "reward": 0.0,
        "timed_out": True,
        "failure": message,
    }
    names = sorted(set(component_names))
    if names:
        record["reward_components"] = dict.fromkeys(names, 0.0)
    return record
