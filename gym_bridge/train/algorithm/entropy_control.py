"""Adaptive entropy control: the entropy bonus's coefficient steered toward a target entropy.

A fixed ``loss_fn.entropy_coeff`` is either too weak to stop entropy collapse (every sample of a group
alike, so no group carries signal) or strong enough to stop learning. After Skywork-OR1's adaptive
entropy control (He et al. 2025), with ``loss_fn.entropy_target`` set the coefficient follows the
entropy of each step's samples instead:

    e_k = mean over generated tokens of -log pi_gen(token)         (the sampler's, at its temperature)
    c_k = max(0, c_{k-1} + delta)   if e_k < target
          max(0, c_{k-1} - delta)   otherwise                        c_0 = loss_fn.entropy_coeff
    bonus coefficient of step k = c_k if e_k < target else 0

so the bonus switches on only once the samples' entropy has fallen below the target, grows by
``loss_fn.entropy_coeff_delta`` a step while it stays below, and decays once it is back above. Without
a target the coefficient is ``entropy_coeff`` on every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gym_bridge.train.batches.rollouts import Sample
from gym_bridge.train.config.loss import ClippedPGLossConfig

__all__ = ["DEFAULT_DELTA", "EntropyControl", "sampled_entropy"]

DEFAULT_DELTA = 0.005
"""The coefficient's step when ``loss_fn.entropy_coeff_delta`` is null (Skywork-OR1's)."""


def sampled_entropy(samples: Sequence[Sample]) -> float | None:
    """Mean negative log-prob the sampler gave its own generated tokens (a Monte Carlo estimate of the
    per-token entropy at the sampling temperature); None when no sample carries log-probs."""
    total, count = 0.0, 0
    for sample in samples:
        if sample.generation_logprobs is None:
            continue
        for logprob, trained in zip(sample.generation_logprobs, sample.loss_mask, strict=False):
            if trained:
                total -= logprob
                count += 1
    return total / count if count else None


@dataclass
class EntropyControl:
    """The entropy bonus's coefficient, fixed or adapted step by step (module docstring)."""

    coeff: float
    """c_k: the current coefficient (``loss_fn.entropy_coeff`` before the first step)."""
    target: float | None = None
    delta: float = 0.0

    @classmethod
    def from_config(cls, cfg: ClippedPGLossConfig) -> EntropyControl:
        delta = DEFAULT_DELTA if cfg.entropy_coeff_delta is None else cfg.entropy_coeff_delta
        return cls(coeff=cfg.entropy_coeff, target=cfg.entropy_target, delta=delta)

    @property
    def adaptive(self) -> bool:
        return self.target is not None

    def step(self, samples: Sequence[Sample]) -> tuple[float, dict[str, float]]:
        """Update c_k from this step's samples; return the bonus coefficient for this step's loss and
        the metrics to log (``sampled_entropy``, ``entropy_coeff``)."""
        if self.target is None:
            return self.coeff, {"entropy_coeff": self.coeff} if self.coeff else {}
        entropy = sampled_entropy(samples)
        if entropy is None:
            raise ValueError(
                "loss_fn.entropy_target steers the entropy bonus by the sampler's log-probs, and this "
                "step's samples carry none (offline data without generation log-probs?): drop "
                "loss_fn.entropy_target or use a fixed loss_fn.entropy_coeff"
            )
        below = entropy < self.target
        self.coeff = max(0.0, self.coeff + (self.delta if below else -self.delta))
        applied = self.coeff if below else 0.0
        return applied, {"sampled_entropy": entropy, "entropy_coeff": applied}

    def state_dict(self) -> dict[str, Any]:
        return {"coeff": self.coeff}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore c_k from a checkpoint (one written before this controller existed keeps c_0)."""
        if state is not None and self.adaptive:
            self.coeff = float(state["coeff"])
