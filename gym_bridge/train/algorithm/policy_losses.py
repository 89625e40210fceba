"""The policy-loss surrogates by name (``loss_fn.policy_loss``): the per-token actor term, one function each.

A surrogate gets the micro-batch's ratios already computed and clipped (:class:`SurrogateTerms`) and
returns the per-token actor loss; :class:`gym_bridge.train.algorithm.loss.ClippedPGLossFn` does the rest once
for all of them: the ratios (per token, or per sequence for a variant registered with
``sequence_level=True``), the dual clip, the off-policy correction, the aggregation, the KL and
entropy terms and the metrics. :data:`gym_bridge.train.registry.POLICY_LOSSES` names these (``gspo``
with ``sequence_level=True``, ``cispo`` with ``dual_clip=False``); register another with
:func:`gym_bridge.train.registry.register_policy_loss`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SurrogateTerms", "cispo", "gspo", "ppo"]


@dataclass(frozen=True)
class SurrogateTerms:
    """What a surrogate reads, each (b, t) over the micro-batch's tokens (mask them yourself only if a
    term must not reach padding: the aggregation masks the result)."""

    logprobs: torch.Tensor
    """log pi_t of the policy being trained (carries the gradient)."""
    ratios: torch.Tensor
    """r_t = pi_t / pi_old_t (one per sequence, repeated over its tokens, when sequence-level)."""
    clipped_ratios: torch.Tensor
    """clip(r_t, 1 - loss_fn.ratio_clip_min, 1 + loss_fn.ratio_clip_max)."""
    advantages: torch.Tensor
    """A_t: the sample's advantage on each of its tokens (or per-token advantages)."""


def ppo(t: SurrogateTerms) -> torch.Tensor:
    """PPO's clipped surrogate (NeMo RL's ``ClippedPGLossFn``; DAPO's clip-higher with ratio_clip_max >
    ratio_clip_min): ``actor_t = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high))``."""
    return torch.max(-t.advantages * t.ratios, -t.advantages * t.clipped_ratios)


def gspo(t: SurrogateTerms) -> torch.Tensor:
    """GSPO (Zheng et al. 2025): PPO's surrogate on one length-normalised ratio per sequence,
    ``s_i = exp(mean_t(logp_t - logp_old_t))``: ``actor_t = max(-A_i s_i, -A_i clip(s_i, 1 - eps_low,
    1 + eps_high))``."""
    return ppo(t)


def cispo(t: SurrogateTerms) -> torch.Tensor:
    """CISPO (MiniMax-M1, 2025): REINFORCE weighted by the clipped ratio, the weight's gradient stopped
    (clipped tokens still pass gradient): ``actor_t = -A_t sg(clip(r_t, 1 - eps_low, 1 + eps_high)) logp_t``."""
    return -t.advantages * t.clipped_ratios.detach() * t.logprobs
