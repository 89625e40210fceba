"""A step whose numbers are no longer finite stops the run before its weights reach a checkpoint.

Why: with a learning rate far too high (or one reward of 1e39, which is ``inf`` in float32) the loss and
gradient norm became NaN, AdamW wrote NaN into every weight, and the run went on to its last step, saved
NaN weights in every later checkpoint and exited 0 ("done: 4 steps"). Now:

* before the update, rewards too large for the float32 group statistics (or advantages that are not
  finite) stop the run with the step's reward range: the weights are untouched;
* after the update, a non-finite loss or gradient norm stops the run once the step's metrics are logged
  (so ``metrics.jsonl`` shows it), before validation and before its checkpoint. float16's loss scaler
  skips an overflowed optimizer step by design (its weights stay finite): such a step is not divergence.

The checkpoints already written are kept; the message names the last complete one.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["TrainingDiverged", "check_advantages", "check_update"]

WATCHED = ("loss", "grad_norm")
"""Update metrics that are finite in every healthy step (a float16 step the scaler skipped has no ``grad_norm``)."""


class TrainingDiverged(RuntimeError):
    """A step produced non-finite advantages, loss or gradients: the run stops before saving its weights."""


def _latest(checkpoints: Any) -> str:
    latest = checkpoints.latest() if checkpoints is not None else None
    if latest is None:
        return "there is no checkpoint of this run yet"
    return f"the last complete checkpoint is {latest.path} (step {latest.step})"


REWARD_LIMIT = math.sqrt(torch.finfo(torch.float32).max)
"""Largest reward magnitude the group statistics can take: they square rewards in float32 (NeMo RL's
arithmetic), and a reward of 1e20 overflowed the std to inf, which the zero-std rule then read as 0, so
its advantage went out unnormalised (1e20)."""


def check_advantages(
    step: int, advantages: torch.Tensor, rewards: list[float], checkpoints: Any = None
) -> None:
    """Raise :class:`TrainingDiverged` when a step's rewards are too large for the advantages' statistics
    or its advantages are not all finite (before any update)."""
    if bool(torch.isfinite(advantages).all()) and all(abs(r) < REWARD_LIMIT for r in rewards):
        return
    low, high = min(rewards, default=math.nan), max(rewards, default=math.nan)
    raise TrainingDiverged(
        f"step {step}: the rewards (from {low:g} to {high:g}) are too large for the advantages' float32 "
        f"statistics (|reward| must stay below {REWARD_LIMIT:.3g}), so the step cannot train: fix the reward "
        f"source (an environment's /verify or the dataset's reward column); no update was made and "
        f"{_latest(checkpoints)}"
    )


def check_update(step: int, metrics: dict[str, Any], lr: float, checkpoints: Any = None) -> None:
    """Raise :class:`TrainingDiverged` when the step's update metrics are not finite (the weights are then
    unusable: NaN gradients make NaN weights)."""
    skipped_by_scaler = bool(metrics.get("amp_skipped_steps"))
    bad = {
        key: metrics[key]
        for key in WATCHED
        if key in metrics
        and not math.isfinite(float(metrics[key]))
        and not (key == "loss" and skipped_by_scaler)
    }
    if not bad:
        return
    values = ", ".join(f"{key} {value}" for key, value in bad.items())
    raise TrainingDiverged(
        f"step {step}: training diverged ({values}, lr {lr:g}): the weights are no longer finite, so the run "
        f"stops without saving them; {_latest(checkpoints)}. Lower policy.optimizer.kwargs.lr (or set "
        "policy.max_grad_norm) and start over with --fresh"
    )
