"""NeMo RL's clipped policy-gradient loss (``ClippedPGLossFn``) with reference KL and its metrics.

The loss, for valid tokens t of sample i (mask = token_mask * sample_mask)::

    r_t       = exp(logp_t - logp_prev_t)                      probability ratio to the step's policy
    r_t       = exp(mean_t'(logp_t' - logp_prev_t'))  sequence-level variants (GSPO): one per sequence
    actor_t   = surrogate(r_t, clip(r_t, 1 - ratio_clip_min, 1 + ratio_clip_max), A_i, logp_t)
    actor_t   = min(actor_t, -A_i * c)           only where A_i < 0 and ratio_clip_c = c is set (dual clip)
    actor_t  *= exp(logp_prev_t - logp_gen_t)    with use_importance_sampling_correction (capped by TIS);
                                                 sequence-level: exp(sum_t(logp_prev_t - logp_gen_t))
    w_t       = exp(logp_t - logp_gen_t)         with use_on_policy_kl_approximation
    w_t       = exp(logp_t - sg(logp_t))         otherwise (value 1; sg = stop-gradient)
    kl_t      = beta * clamp_out(w_t * k(clamp_in(logp_ref_t - logp_t)))   Schulman's k1/k2/k3
    loss      = reduce(actor) + reduce(kl) - entropy_coeff * reduce(-(pi_t / pi_gen_t) logp_t)

The surrogate is the function ``loss_fn.policy_loss`` names (:mod:`gym_bridge.train.algorithm.policy_losses`:
``ppo`` = max(-A r, -A clip(r)), ``gspo``, ``cispo`` = -A sg(clip(r)) logp, or one registered with
:func:`gym_bridge.train.registry.register_policy_loss`); the rest above is written once, here, for all.

``reduce`` is, with ``token_level_loss``, the sum over valid tokens divided by the number of valid
tokens in the *global* batch; otherwise each sequence's token mean, summed over valid sequences and
divided by the number of valid sequences in the global batch. With ``loss_type: dr_grpo`` (Dr. GRPO,
Liu et al. 2025; TRL's name) it is the sum over valid tokens divided by a constant per sequence:
valid sequences in the global batch x ``max_completion_length``, so a token's weight does not depend
on how long its sequence or the batch's sequences are. Because the denominators are global
(``global_valid_toks`` / ``global_valid_seqs``, from :func:`global_normalizers` on the whole batch),
the losses of micro-batches add up to the loss of the full batch: call ``backward()`` on each
micro-batch loss and the gradients accumulate to the full-batch gradient.

Inputs are per-token log-probs already aligned with the generated tokens, all shaped (b, t):
column j holds log p(token_{j+1} | tokens_{<=j}) for the sequence's tokens. NeMo RL's loss takes
logits and shifts by one internally; here :func:`gather_token_logprobs` does that step.

Metrics use NeMo RL's names. Like NeMo RL's, the mean metrics are divided by the global counts, so
summing them over micro-batches gives the full-batch value; :func:`reduce_microbatch_metrics` does
that (sum, except ``*_min`` / ``*_max``).

Why the KL weight carries the gradient (NeMo RL's "fix: KL backward in GRPO", its PR 2506). The term
is beta * KL(pi || pi_ref) = beta * E_{y~pi}[k(y)], with k one of Schulman's estimators of
log r = log pi_ref - log pi. Its samples come from the policy being trained, so its gradient has a
score-function part besides the gradient of k::

    grad E_{y~pi}[k(y)] = E_{y~pi}[grad k(y) + k(y) grad log pi(y)]

Written over samples of pi_gen with w = pi / pi_gen kept in the graph, grad(w k) = w (grad k +
k grad log pi), which is both parts; without the approximation the samples are taken as pi's own and
w = exp(logp - sg(logp)) is 1 in value and grad log pi in gradient. For the unbiased k1 and k3,
E_pi[k] = KL(pi || pi_ref), so the expected gradient is exactly grad KL(pi || pi_ref) (for k2 it is
the gradient of E_pi[(log r)^2 / 2]). A detached weight drops the second part: in expectation k1 then
gives no gradient at all (E_pi[grad log pi] = 0) and k3 gives grad KL(pi_ref || pi), the forward KL
(tests/train/test_loss_kl.py sums over every outcome of a small categorical policy to check this).

Clamps, in the order of NeMo RL's ``calculate_kl``: the weight multiplies k before the output clamp,
so a token whose w * k is clamped has no gradient; where the input clamp on log r is active the
weight is detached, so such a token has no gradient either (k of a constant is a constant).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gym_bridge.models.logprobs import gather_logprobs
from gym_bridge.train.algorithm.policy_losses import SurrogateTerms
from gym_bridge.train.registry import POLICY_LOSSES

if TYPE_CHECKING:
    from gym_bridge.train.config import ClippedPGLossConfig

__all__ = [
    "ClippedPGLossFn",
    "calculate_kl",
    "gather_token_logprobs",
    "global_normalizers",
    "masked_mean",
    "metrics_to_floats",
    "reduce_microbatch_metrics",
]


def masked_mean(
    values: torch.Tensor,
    mask: torch.Tensor,
    dim: int | None = None,
    global_normalization_factor: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """``sum(values * mask) / (denominator + 1e-8)``; the denominator is ``mask.sum`` unless given."""
    denominator = mask.sum() if dim is None else mask.sum(dim=dim)
    if global_normalization_factor is not None:
        denominator = global_normalization_factor
    summed = (values * mask).sum() if dim is None else (values * mask).sum(dim=dim)
    return summed / (denominator + 1e-8)


def calculate_kl(
    logprobs: torch.Tensor,
    logprobs_reference: torch.Tensor,
    kl_type: str = "k3",
    input_clamp_value: float | None = 20.0,
    output_clamp_value: float | None = 10.0,
    importance_sampling_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020), with log r = ref - pi.

    k1 = -log r, k2 = (log r)^2 / 2, k3 = exp(log r) - 1 - log r; log r is clamped to
    ``[-input_clamp_value, input_clamp_value]`` and the result to ``[-output_clamp_value,
    output_clamp_value]`` (None disables either clamp). ``importance_sampling_weights`` multiply
    the estimate before the output clamp, and are detached where the input clamp is active, so a
    clamped token passes no gradient through its weight either (NeMo RL's order, see the module
    docstring).
    """
    log_ratio = logprobs_reference - logprobs
    if input_clamp_value is not None:
        clamped = log_ratio.clamp(min=-input_clamp_value, max=input_clamp_value)
        if importance_sampling_weights is not None:
            importance_sampling_weights = torch.where(
                log_ratio == clamped, importance_sampling_weights, importance_sampling_weights.detach()
            )
        log_ratio = clamped
    if kl_type == "k1":
        kl = -log_ratio
    elif kl_type == "k2":
        kl = torch.square(log_ratio) / 2
    elif kl_type == "k3":
        kl = torch.exp(log_ratio) - 1 - log_ratio
    else:
        raise ValueError(f"invalid KL type {kl_type!r}: expected k1, k2 or k3")
    if importance_sampling_weights is not None:
        kl = importance_sampling_weights * kl
    if output_clamp_value is not None:
        kl = kl.clamp(min=-output_clamp_value, max=output_clamp_value)
    return kl


def gather_token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-probs (b, s-1) of tokens 1..s-1 under logits (b, s, V) of a causal LM, in float32.

    ``logits[:, j]`` predicts ``input_ids[:, j + 1]``; the last position's logits are unused.
    The shift of NeMo RL's loss, then :func:`gym_bridge.models.logprobs.gather_logprobs`.
    """
    return gather_logprobs(logits[:, :-1].float(), input_ids[:, 1:])


def global_normalizers(
    token_mask: torch.Tensor, sample_mask: torch.Tensor | None = None
) -> tuple[float, float]:
    """``(global_valid_toks, global_valid_seqs)`` of a whole batch, for its micro-batches' losses."""
    if sample_mask is None:
        sample_mask = torch.ones(token_mask.shape[0], dtype=token_mask.dtype, device=token_mask.device)
    mask = token_mask * sample_mask.unsqueeze(-1)
    return float(mask.sum()), float(sample_mask.sum())


def reduce_microbatch_metrics(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine per-micro-batch metrics of one global batch: min/max for ``*_min``/``*_max``, else sum.

    Values are floats or 0-dim tensors (:meth:`ClippedPGLossFn.loss_and_metrics`); tensors are combined
    on their device, without a transfer."""
    out: dict[str, Any] = {}
    for item in metrics:
        for key, value in item.items():
            if key not in out:
                out[key] = value
            elif key.endswith(("_min", "_max")):
                pick_min = key.endswith("_min")
                if isinstance(value, torch.Tensor):
                    out[key] = torch.minimum(out[key], value) if pick_min else torch.maximum(out[key], value)
                else:
                    out[key] = min(out[key], value) if pick_min else max(out[key], value)
            else:
                out[key] = out[key] + value
    return out


def metrics_to_floats(metrics: dict[str, Any]) -> dict[str, float]:
    """Tensor metrics as Python floats, in one transfer from their device."""
    keys = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, torch.Tensor)}
    if keys:
        values = torch.stack([metrics[k].detach().double().reshape(()) for k in keys]).tolist()
        out.update(zip(keys, values, strict=True))
    return {k: out[k] for k in metrics}


@dataclass(frozen=True)
class _MicroBatch:
    """One micro-batch's loss inputs in the dtype of ``curr``, its masks and the global normalisers."""

    curr: torch.Tensor
    prev: torch.Tensor
    gen: torch.Tensor
    advantages: torch.Tensor
    """(b, t), a per-sample advantage repeated over the sample's tokens."""
    token_mask: torch.Tensor
    sample_mask: torch.Tensor
    mask: torch.Tensor
    """token_mask * sample_mask: the valid tokens."""
    global_valid_toks: Any
    global_valid_seqs: Any

    def token_mean(self, values: torch.Tensor) -> torch.Tensor:
        """Sum over the valid tokens / the global batch's valid tokens (sums over micro-batches)."""
        return masked_mean(values, self.mask, global_normalization_factor=self.global_valid_toks)


class ClippedPGLossFn:
    """Clipped policy-gradient loss with KL regularisation (PPO / GRPO / DAPO clip-higher / dual clip /
    GSPO / CISPO / Dr. GRPO's normaliser / TIS / entropy bonus).

    Construct from the ``loss_fn`` config section; call once per micro-batch. The surrogate is the
    variant ``loss_fn.policy_loss`` names (:mod:`gym_bridge.train.algorithm.policy_losses`); everything else is
    shared by all of them.
    """

    def __init__(self, cfg: ClippedPGLossConfig, max_completion_length: int | None = None):
        """``max_completion_length`` (generated tokens a sample may have) is Dr. GRPO's normaliser."""
        if cfg.loss_type == "dr_grpo" and max_completion_length is None:
            raise ValueError(
                "loss_fn.loss_type 'dr_grpo' needs max_completion_length (its length normaliser)"
            )
        variant = POLICY_LOSSES.get(cfg.policy_loss_name)
        self.surrogate = variant.fn
        self.sequence_level = bool(variant.traits["sequence_level"])
        self.aggregation = "dr_grpo" if cfg.loss_type == "dr_grpo" else "token" if cfg.token_level_loss else "sequence"
        self.max_completion_length = max_completion_length
        self.ratio_clip_min = cfg.ratio_clip_min
        self.ratio_clip_max = cfg.ratio_clip_max
        self.ratio_clip_c = cfg.ratio_clip_c
        if self.ratio_clip_c is not None and self.ratio_clip_c <= 1:
            raise ValueError(f"ratio_clip_c must exceed 1, got {self.ratio_clip_c}")
        self.reference_policy_kl_penalty = cfg.reference_policy_kl_penalty
        self.reference_policy_kl_type = cfg.reference_policy_kl_type
        self.kl_input_clamp_value = cfg.kl_input_clamp_value
        self.kl_output_clamp_value = cfg.kl_output_clamp_value
        self.use_on_policy_kl_approximation = cfg.use_on_policy_kl_approximation
        self.use_importance_sampling_correction = cfg.use_importance_sampling_correction
        self.truncated_importance_sampling_ratio = cfg.truncated_importance_sampling_ratio
        self.entropy_coeff = cfg.entropy_coeff

    @property
    def needs_reference_logprobs(self) -> bool:
        """Whether callers must compute reference-policy log-probs (KL penalty on)."""
        return self.reference_policy_kl_penalty != 0

    def learns_without_advantage(self, entropy_coeff: float | None = None) -> bool:
        """Whether a batch whose advantages are all zero still has a gradient (a KL or entropy term);
        ``entropy_coeff`` as in :meth:`loss_and_metrics`."""
        bonus = self.entropy_coeff if entropy_coeff is None else entropy_coeff
        return self.needs_reference_logprobs or bonus != 0

    def _reduce(self, values: torch.Tensor, mb: _MicroBatch) -> torch.Tensor:
        """Aggregate per-token values (actor, KL and entropy terms alike): the token mean of the global
        batch, the mean of per-sequence token means, or Dr. GRPO's sum / (sequences x max length)."""
        if self.aggregation == "dr_grpo":
            normaliser = mb.global_valid_seqs * self.max_completion_length
            return masked_mean(values, mb.mask, global_normalization_factor=normaliser)
        if self.aggregation == "token":
            return mb.token_mean(values)
        per_sequence = masked_mean(values, mb.token_mask, dim=-1)
        return masked_mean(per_sequence, mb.sample_mask, global_normalization_factor=mb.global_valid_seqs)

    def __call__(self, curr_logprobs: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """Loss and metrics (as floats) of one micro-batch; arguments as :meth:`loss_and_metrics`."""
        loss, metrics = self.loss_and_metrics(curr_logprobs, **kwargs)
        return loss, metrics_to_floats(metrics)

    def loss_and_metrics(
        self,
        curr_logprobs: torch.Tensor,
        *,
        prev_logprobs: torch.Tensor,
        generation_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        token_mask: torch.Tensor,
        sample_mask: torch.Tensor | None = None,
        reference_logprobs: torch.Tensor | None = None,
        global_valid_toks: torch.Tensor | float | None = None,
        global_valid_seqs: torch.Tensor | float | None = None,
        entropy_coeff: float | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Loss and metrics of one micro-batch, the metrics as 0-dim tensors on the loss's device (the
        trainer reads them once per step, not once per micro-batch).

        Args:
            curr_logprobs: (b, t) log-probs of the generated tokens under the policy being trained
                (carries the gradient).
            prev_logprobs: (b, t) the same under the policy at the start of the step (pi_old).
            generation_logprobs: (b, t) the same as reported by the sampler (pi_gen).
            advantages: (b,) per sample, or (b, t) per token.
            token_mask: (b, t) 1 for tokens trained on (generated), 0 for prompt and padding.
            sample_mask: (b,) 1 for samples in the loss, 0 to drop one (e.g. overlong). Default all 1.
            reference_logprobs: (b, t) under the reference policy; required when the KL penalty is on.
            global_valid_toks: valid tokens (token_mask * sample_mask) in the whole global batch;
                None means this micro-batch is the whole batch.
            global_valid_seqs: valid samples (sample_mask) in the whole global batch; None likewise.
            entropy_coeff: this step's entropy-bonus coefficient (adaptive entropy control,
                :mod:`gym_bridge.train.algorithm.entropy_control`); None means ``loss_fn.entropy_coeff``.
        """
        mb = _micro_batch(
            curr_logprobs, prev_logprobs, generation_logprobs, advantages, token_mask, sample_mask,
            global_valid_toks, global_valid_seqs,
        )  # fmt: skip
        with torch.no_grad():
            mismatch = self._mismatch_metrics(mb.prev, mb.gen, mb.mask, mb.token_mean)
        kl = self._kl(mb, reference_logprobs)
        ratios, clipped_ratios = self._ratios(mb)
        actor = self.surrogate(SurrogateTerms(mb.curr, ratios, clipped_ratios, mb.advantages))
        actor, dual_clipped = self._dual_clip(actor, mb)
        importance_weights = self._importance_weights(mb)
        weights = importance_weights if self.use_importance_sampling_correction else torch.ones_like(mb.prev)
        actor_loss = self._reduce(weights * actor, mb)
        loss = actor_loss + kl
        bonus = self.entropy_coeff if entropy_coeff is None else entropy_coeff  # adapted per step
        if bonus != 0:
            loss = loss - bonus * self._entropy(mb)
        with torch.no_grad():
            metrics = {
                "loss": loss.detach(),
                "actor_loss": actor_loss.detach(),
                "kl_penalty": kl.detach() / self.reference_policy_kl_penalty
                if self.reference_policy_kl_penalty
                else torch.zeros_like(loss.detach()),
                **self._ratio_metrics(mb, ratios, clipped_ratios, dual_clipped),
                **mismatch,
                "sampling_importance_ratio": masked_mean(
                    importance_weights[:, 0], mb.sample_mask, global_normalization_factor=mb.global_valid_seqs
                ).item()
                if self.sequence_level
                else mb.token_mean(importance_weights),
                # E_gen[-(pi / pi_gen) log pi]: a Monte Carlo entropy estimate from the rollouts.
                "approx_entropy": -mb.token_mean(torch.exp(mb.curr - mb.gen) * mb.curr),
                "num_valid_samples": mb.sample_mask.sum(),
            }
        return loss, metrics

    def _kl(self, mb: _MicroBatch, reference_logprobs: torch.Tensor | None) -> torch.Tensor:
        """beta * reduce(w_t * k(logp_ref_t - logp_t)), w_t in the graph (see the module docstring)."""
        if self.reference_policy_kl_penalty == 0:
            return torch.zeros((), dtype=mb.curr.dtype, device=mb.curr.device)
        if reference_logprobs is None:
            raise ValueError("reference_logprobs are required when reference_policy_kl_penalty != 0")
        if self.use_on_policy_kl_approximation:
            kl_weights = torch.exp(mb.curr - mb.gen)
        else:
            kl_weights = torch.exp(mb.curr - mb.curr.detach())
        kl_weights = torch.nan_to_num(kl_weights, nan=0.0, posinf=0.0, neginf=0.0)
        kl_per_token = self.reference_policy_kl_penalty * calculate_kl(
            mb.curr,
            reference_logprobs.to(mb.curr.dtype),
            kl_type=self.reference_policy_kl_type,
            input_clamp_value=self.kl_input_clamp_value,
            output_clamp_value=self.kl_output_clamp_value,
            importance_sampling_weights=kl_weights,
        )
        return self._reduce(kl_per_token, mb)

    def _ratios(self, mb: _MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """r_t = exp(logp_t - logp_prev_t), or one ``exp(mean_t(...))`` per sequence; and r clipped."""
        log_ratios = mb.curr - mb.prev
        if self.sequence_level:
            ratios = masked_mean(log_ratios, mb.token_mask, dim=-1).exp().unsqueeze(-1).expand_as(log_ratios)
        else:
            ratios = torch.exp(log_ratios)
        return ratios, ratios.clamp(1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max)

    def _dual_clip(self, actor: torch.Tensor, mb: _MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """With ratio_clip_c = c: ``min(actor_t, -A_t c)`` where A_t < 0; and where that capped it."""
        if self.ratio_clip_c is None:
            return actor, torch.zeros_like(mb.mask, dtype=torch.bool)
        cap = -mb.advantages * self.ratio_clip_c
        negative = mb.advantages < 0
        return torch.where(negative, torch.min(actor, cap), actor), negative & (cap < actor)

    def _importance_weights(self, mb: _MicroBatch) -> torch.Tensor:
        """pi_prev / pi_gen per token (per sequence: exp of the summed log-ratio), capped by TIS."""
        log_weights = mb.prev - mb.gen
        if self.sequence_level:  # the sequence's likelihood ratio, per sequence
            log_weights = (log_weights * mb.mask).sum(dim=-1, keepdim=True).expand_as(log_weights)
        weights = torch.nan_to_num(torch.exp(log_weights), nan=0.0, posinf=0.0, neginf=0.0)
        if self.truncated_importance_sampling_ratio is not None:
            weights = weights.clamp(max=self.truncated_importance_sampling_ratio)
        return weights

    def _entropy(self, mb: _MicroBatch) -> torch.Tensor:
        """H = E_gen[-(pi / pi_gen) log pi], the weight in the graph (its score-function gradient)."""
        entropy_weights = torch.nan_to_num(torch.exp(mb.curr - mb.gen), posinf=0.0)
        return self._reduce(-entropy_weights * mb.curr, mb)

    def _ratio_metrics(
        self, mb: _MicroBatch, ratios: torch.Tensor, clipped: torch.Tensor, dual_clipped: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        r = ratios.detach()
        valid = mb.mask.bool()
        inf = torch.tensor(torch.inf, dtype=r.dtype, device=r.device)

        def valid_min(values: torch.Tensor) -> torch.Tensor:  # +inf without valid tokens, no sync
            return torch.where(valid, values.detach(), inf).amin()

        def valid_max(values: torch.Tensor) -> torch.Tensor:
            return torch.where(valid, values.detach(), -inf).amax()

        low, high = 1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max
        return {
            "probs_ratio": mb.token_mean(r),
            "probs_ratio_clamped": mb.token_mean(clipped.detach()),
            "probs_ratio_min": valid_min(r),
            "probs_ratio_max": valid_max(r),
            "probs_ratio_clamped_min": valid_min(clipped),
            "probs_ratio_clamped_max": valid_max(clipped),
            "clip_fraction_low": mb.token_mean(((r < low) & (mb.advantages < 0)).to(r)),
            "clip_fraction_high": mb.token_mean(((r > high) & (mb.advantages > 0)).to(r)),
            "dual_clip_fraction": mb.token_mean(dual_clipped.to(r)),
        }

    def _mismatch_metrics(
        self,
        prev_logprobs: torch.Tensor,
        generation_logprobs: torch.Tensor,
        mask: torch.Tensor,
        token_mean: Any,
    ) -> dict[str, torch.Tensor]:
        """How far the sampler's log-probs are from the trainer's (NeMo RL's metrics of these names;
        docs/guides/training.md, Metrics)."""
        kl_type = self.reference_policy_kl_type
        lp_error = torch.abs(generation_logprobs - prev_logprobs)
        log_mixture = torch.log(0.5 * torch.exp(prev_logprobs) + 0.5 * torch.exp(generation_logprobs))
        kl_prev_to_mixture = torch.exp(prev_logprobs - log_mixture) - (prev_logprobs - log_mixture) - 1
        kl_gen_to_mixture = (
            torch.exp(generation_logprobs - log_mixture) - (generation_logprobs - log_mixture) - 1
        )
        return {
            "token_mult_prob_error": token_mean(torch.exp(lp_error * mask)),
            # KL(P_gen || P_policy) and KL(P_policy || P_gen), estimated with the loss's KL type.
            "gen_kl_error": token_mean(calculate_kl(generation_logprobs, prev_logprobs, kl_type, None, None)),
            "policy_kl_error": token_mean(
                calculate_kl(prev_logprobs, generation_logprobs, kl_type, None, None)
            ),
            "js_divergence_error": token_mean(0.5 * kl_prev_to_mixture + 0.5 * kl_gen_to_mixture),
        }


def _micro_batch(
    curr: torch.Tensor,
    prev: torch.Tensor,
    gen: torch.Tensor,
    advantages: torch.Tensor,
    token_mask: torch.Tensor,
    sample_mask: torch.Tensor | None,
    global_valid_toks: Any,
    global_valid_seqs: Any,
) -> _MicroBatch:
    """The inputs in ``curr``'s dtype, advantages per token, masks, and the normalisers (this
    micro-batch's own counts where the global ones are None)."""
    if sample_mask is None:
        sample_mask = torch.ones(curr.shape[0], dtype=curr.dtype, device=curr.device)
    token_mask = token_mask.to(curr.dtype)
    sample_mask = sample_mask.to(curr.dtype)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(curr.dtype).expand_as(curr)
    mask = token_mask * sample_mask.unsqueeze(-1)
    return _MicroBatch(
        curr=curr,
        prev=prev.to(curr.dtype),
        gen=gen.to(curr.dtype),
        advantages=advantages,
        token_mask=token_mask,
        sample_mask=sample_mask,
        mask=mask,
        global_valid_toks=mask.sum().detach() if global_valid_toks is None else global_valid_toks,
        global_valid_seqs=sample_mask.sum().detach() if global_valid_seqs is None else global_valid_seqs,
    )
