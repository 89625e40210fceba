"""DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), NeMo RL's ``grpo.reward_shaping``.

A response that runs long is penalised in proportion to how far into the last ``L_cache`` tokens
before the limit ``L_max`` it reaches, instead of being cut off with no signal::

    R_length(y) = 0                                     if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
                = -1                                    if |y| > L_max

and the training reward is ``reward + overlong_buffer_penalty * R_length``. ``|y|`` counts the
generated tokens of the rollout (every turn's, for multi-turn rollouts). NeMo RL's version has no
floor at -1, which only matters when ``max_response_length`` is below the generation limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from gym_bridge.train.config import RewardShapingConfig

__all__ = ["overlong_penalty", "shape_rewards"]


def overlong_penalty(
    lengths: torch.Tensor, max_response_length: int, overlong_buffer_length: int, penalty: float = 1.0
) -> torch.Tensor:
    """``penalty * R_length`` per response (<= 0), from (b,) generated-token counts."""
    expected = max_response_length - overlong_buffer_length
    excess = (lengths.to(torch.float64) - expected) / overlong_buffer_length
    return -penalty * excess.clamp(min=0.0, max=1.0)


def shape_rewards(rewards: torch.Tensor, lengths: torch.Tensor, cfg: RewardShapingConfig) -> torch.Tensor:
    """The rewards with the overlong penalty added when ``cfg.enabled``; unchanged otherwise."""
    if not cfg.enabled:
        return rewards
    if cfg.overlong_buffer_length is None or cfg.max_response_length is None:
        raise ValueError("grpo.reward_shaping needs overlong_buffer_length and max_response_length")
    penalty = overlong_penalty(
        lengths, cfg.max_response_length, cfg.overlong_buffer_length, cfg.overlong_buffer_penalty
    )
    return rewards + penalty.to(rewards.dtype)
