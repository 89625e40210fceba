"""The ``loss_fn`` section (NeMo RL's ``ClippedPGLossConfig``): the clipped policy-gradient loss and
its variants (GSPO, CISPO, Dr. GRPO's normaliser, TRL's ``loss_type`` names). Every field is documented
with an attribute docstring."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gym_bridge.train.config.base import Section
from gym_bridge.train.registry import POLICY_LOSSES

LOSS_TYPE_IMPLIES: dict[str, dict[str, Any]] = {
    "grpo": {"token_level_loss": False},
    "bnpo": {"token_level_loss": True},
    "dapo": {"token_level_loss": True},
    "dr_grpo": {"token_level_loss": True},
    "cispo": {"token_level_loss": True, "use_cispo": True},
}
"""The NeMo RL loss keys each TRL ``loss_type`` stands for."""

KEY_SELECTS = {"sequence_level_importance_ratios": "gspo", "use_cispo": "cispo"}
"""NeMo RL's keys that select a policy loss other than ``ppo`` when true."""


def _yaml(value: Any) -> str:
    """A value as YAML spells it, for messages."""
    return str(value).lower() if isinstance(value, bool) or value is None else str(value)


class ClippedPGLossConfig(Section):
    """Clipped policy-gradient loss with reference KL (NeMo RL's ``loss_fn:`` section)."""

    reference_policy_kl_penalty: float = Field(0.01, ge=0.0)
    """KL penalty coefficient beta against the reference (initial) policy; 0 disables the KL term and
    the reference forward pass. Default 0.01."""

    reference_policy_kl_type: Literal["k1", "k2", "k3"] = "k3"
    """Schulman's KL estimator: k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r, with
    r = pi_ref / pi. Default k3."""

    kl_input_clamp_value: float | None = Field(20.0, gt=0.0)
    """Clamp log r to [-v, v] before the KL estimator; null disables. Default 20."""

    kl_output_clamp_value: float | None = Field(10.0, gt=0.0)
    """Clamp the per-token KL estimate to [-v, v]; null disables. Default 10."""

    ratio_clip_min: float = Field(0.2, ge=0.0)
    """Lower PPO clip: the ratio is clipped at 1 - ratio_clip_min. Default 0.2."""

    ratio_clip_max: float = Field(0.2, ge=0.0)
    """Upper PPO clip: the ratio is clipped at 1 + ratio_clip_max (DAPO's clip-higher sets it above
    ratio_clip_min). Default 0.2."""

    ratio_clip_c: float | None = Field(None, gt=1.0)
    """Dual-clip constant c > 1 (Ye et al. 2019): for negative advantages the loss is capped at
    -c * A; null disables. Default null."""

    use_on_policy_kl_approximation: bool = False
    """Weight the KL term by pi / pi_gen so the estimate is unbiased for the current policy. Default false."""

    use_importance_sampling_correction: bool = False
    """Weight the actor term by pi_prev / pi_gen to correct for generation/training mismatch. Default false."""

    truncated_importance_sampling_ratio: float | None = Field(None, gt=0.0)
    """Cap the importance weights at this value (TIS); needs use_importance_sampling_correction.
    Default null."""

    token_level_loss: bool = True
    """true: mean over all valid tokens of the global batch (DAPO's token-level loss); false: mean over
    tokens per sequence, then mean over sequences. Default true."""

    sequence_level_importance_ratios: bool = False
    """GSPO (Zheng et al. 2025): one ratio per sequence, ``s_i = exp(mean_t(logp_t - logp_prev_t))``
    over its valid tokens (the length-normalised log-ratio), clipped to [1 - ratio_clip_min,
    1 + ratio_clip_max] per sequence in place of the token ratios; the off-policy correction of
    use_importance_sampling_correction becomes per sequence too (``exp(sum_t(logp_prev_t -
    logp_gen_t))``, as NeMo RL). Needs token_level_loss false: left out, it is set so; true is
    refused. Default false."""

    use_cispo: bool = False
    """CISPO (MiniMax-M1, 2025): the per-token loss is ``-A * sg(clip(r_t, 1 - ratio_clip_min,
    1 + ratio_clip_max)) * logp_t``, a REINFORCE term weighted by the clipped ratio with the weight's
    gradient stopped, so clipped tokens still pass gradient (MiniMax clips only the top: set a large
    ratio_clip_min). Needs token_level_loss true; refused with sequence_level_importance_ratios and
    with ratio_clip_c (NeMo RL's rules). Default false."""

    entropy_coeff: float = Field(0.0, ge=0.0)
    """Entropy bonus (verl's ``actor.entropy_coeff``): the loss subtracts ``entropy_coeff * H``, H the
    policy's per-token entropy estimated on the sampled tokens, ``E_gen[-(pi / pi_gen) log pi]``, with
    the weight ``pi / pi_gen`` kept in the graph so the gradient is the entropy's,
    ``-E_pi[(log pi + 1) grad log pi]``; reduced over tokens like the actor term. It counters entropy
    collapse (every sample of a group alike, so no group carries a learning signal); a step with no
    advantage anywhere still trains when it is on. With entropy_target set, the starting value of the
    adaptive coefficient. Default 0 (off)."""

    entropy_target: float | None = Field(None, gt=0.0)
    """Adaptive entropy control (after Skywork-OR1): the bonus's coefficient starts at entropy_coeff
    and after each step's sampling moves by entropy_coeff_delta, up while the samples' entropy (the
    sampler's mean negative log-prob of its generated tokens, logged as ``sampled_entropy``) is below
    this target and down (not under 0) while above; the bonus applies only on steps below the target.
    The applied coefficient is logged as ``entropy_coeff`` and kept in checkpoints. Needs the sampler's
    log-probs (online, or offline data that has them). null: entropy_coeff on every step. Default null."""

    entropy_coeff_delta: float | None = Field(None, gt=0.0)
    """How far the adaptive coefficient moves per step (needs entropy_target); null means 0.005
    (Skywork-OR1's step). Default null."""

    loss_type: Literal["grpo", "bnpo", "dapo", "dr_grpo", "cispo"] | None = None
    """TRL's ``GRPOConfig.loss_type``, for what NeMo RL names otherwise: ``grpo`` means token_level_loss
    false; ``bnpo`` and ``dapo`` token_level_loss true (one global batch here, so they agree);
    ``cispo`` use_cispo true; ``dr_grpo`` (Liu et al. 2025) sums the token terms of the batch and
    divides by ``valid sequences x policy.generation.max_new_tokens``, a constant length normaliser,
    instead of by the valid tokens (token_level_loss true), and sets grpo.normalize_rewards false.
    Keys it implies are set when left out and refused when they disagree. null: the keys above decide.
    Default null."""

    policy_loss: str | None = None
    """The policy-loss surrogate by name, one function each (``gym_bridge/train/algorithm/policy_losses.py``; a new
    one is a function registered with ``gym_bridge.train.registry.register_policy_loss``, see
    docs/guides/training.md): ``ppo``, PPO's clipped ``max(-A r, -A clip(r))`` (NeMo RL's, with the dual
    clip of ratio_clip_c); ``gspo``, the same on one length-normalised ratio per sequence (what
    sequence_level_importance_ratios true selects); ``cispo``, ``-A sg(clip(r)) logp`` (what use_cispo
    true selects). Naming gspo or cispo sets its key; a key that selects another loss is refused. null:
    those two keys decide (``ppo`` when both are false). Default null."""

    @field_validator("policy_loss")
    @classmethod
    def _registered(cls, name: str | None) -> str | None:
        if name is not None:
            POLICY_LOSSES.get(name)  # refuses an unknown name, listing the registered ones
        return name

    @property
    def policy_loss_name(self) -> str:
        """The policy loss in use: ``policy_loss``, or the one NeMo RL's keys select."""
        if self.policy_loss is not None:
            return self.policy_loss
        return next((name for key, name in KEY_SELECTS.items() if getattr(self, key)), "ppo")

    @model_validator(mode="after")
    def _implied_settings(self) -> ClippedPGLossConfig:
        decided = {key: f"loss_fn.{key}={_yaml(getattr(self, key))}" for key in self.model_fields_set}
        if self.loss_type is not None:
            self._imply(f"loss_fn.loss_type={self.loss_type!r}", LOSS_TYPE_IMPLIES[self.loss_type], decided)
        if self.policy_loss is not None:  # its own key true, the others' false
            keys = {key: name == self.policy_loss for key, name in KEY_SELECTS.items()}
            self._imply(f"loss_fn.policy_loss={self.policy_loss!r}", keys, decided)
        for key, token_level in (("sequence_level_importance_ratios", False), ("use_cispo", True)):
            if getattr(self, key):  # read after loss_type and policy_loss, which may set it
                self._imply(decided.get(key, f"loss_fn.{key}=true"), {"token_level_loss": token_level}, decided)
        if self.use_cispo and self.sequence_level_importance_ratios:
            raise ValueError(
                "loss_fn.use_cispo weights tokens; loss_fn.sequence_level_importance_ratios (GSPO) "
                "weights sequences: set one"
            )
        if self.ratio_clip_c is not None and not POLICY_LOSSES.get(self.policy_loss_name).traits["dual_clip"]:
            chosen = "loss_fn.use_cispo" if self.policy_loss is None else f"loss_fn.policy_loss={self.policy_loss!r}"
            raise ValueError(f"loss_fn.ratio_clip_c (dual clip) does not apply to {chosen}: set it to null")
        return self

    def _imply(self, source: str, implied: dict[str, Any], decided: dict[str, str]) -> None:
        """Set what ``source`` implies; refuse a key the user (or an earlier source) set otherwise."""
        for key, value in implied.items():
            if getattr(self, key) != value:
                if key in decided:
                    raise ValueError(
                        f"{decided[key]} contradicts {source}, which needs loss_fn.{key}={_yaml(value)}"
                    )
                setattr(self, key, value)
            decided.setdefault(key, f"{source} (so loss_fn.{key}={_yaml(value)})")

    @model_validator(mode="after")
    def _delta_needs_target(self) -> ClippedPGLossConfig:
        if self.entropy_coeff_delta is not None and self.entropy_target is None:
            raise ValueError(
                "loss_fn.entropy_coeff_delta moves the adaptive entropy coefficient, which needs "
                "loss_fn.entropy_target: set a target or drop the delta"
            )
        return self

    @model_validator(mode="after")
    def _tis_needs_is(self) -> ClippedPGLossConfig:
        if (
            self.truncated_importance_sampling_ratio is not None
            and not self.use_importance_sampling_correction
        ):
            raise ValueError(
                "loss_fn.truncated_importance_sampling_ratio needs "
                "loss_fn.use_importance_sampling_correction=true"
            )
        return self
