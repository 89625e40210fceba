"""The policy update of one GRPO step: its samples cut into optimizer steps of micro-batches.

Each ``policy.train_global_batch_size`` samples are one optimizer step: gradients accumulate over
micro-batches (each loss normalised by the whole batch's valid tokens/sequences, so the sum equals
the full-batch loss), are clipped to ``policy.max_grad_norm``, then AdamW and the scheduler step.
The scheduler steps once per optimizer batch whatever happens, so the LR schedule follows the total
that :func:`gym_bridge.train.setup.build_optimizer` planned.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from gym_bridge.models.host_memory import release_freed_memory
from gym_bridge.models.shared_prefix import common_start
from gym_bridge.train.algorithm.advantages import AdvantageInputs, estimate_advantages
from gym_bridge.train.algorithm.loss import reduce_microbatch_metrics
from gym_bridge.train.algorithm.reward_components import gdpo_components, training_rewards
from gym_bridge.train.algorithm.reward_shaping import shape_rewards
from gym_bridge.train.batches.rollouts import Sample
from gym_bridge.train.batches.sequences import (
    make_micro_batch,
    micro_batch_logprobs,
    micro_batches,
    packing_layout,
    pad_rows,
    shares_prompts,
)
from gym_bridge.train.config import GRPOConfig, MasterConfig
from gym_bridge.train.learner.device import Placement

__all__ = ["Learner", "StepBatch", "optimizer_steps", "skip_update", "summarize_update", "update_policy"]


RELEASE_MIN_GAIN = 128 * 2**20
"""Bytes the resident size must have grown by since the last trim for the update to trim again
(:func:`~gym_bridge.models.host_memory.release_freed_memory`): SmolLM2-135M's micro-batches grow it by
600-850 MiB, the tiny model's whole update by ~70 MiB, whose trims took a fifth of its step."""


@dataclass
class Learner:
    """The model being trained and what updates it."""

    model: Any
    tokenizer: Any
    optimizer: Any
    scheduler: Any
    loss_fn: Any
    reference: Any | None
    """The frozen initial policy when the loss has a KL penalty (full fine-tuning), else None."""
    pad_token_id: int
    peft: Any | None = None
    """With LoRA, the ``PeftModel`` around ``model`` (whose layers hold the adapters), else None."""
    placement: Placement = field(default_factory=Placement.cpu)
    """The device every training tensor goes to and the precision (:mod:`gym_bridge.train.learner.device`)."""
    scaler: Any | None = None
    """float16's loss scaler, one per run (its scale adapts across steps); made from ``placement``."""
    workers: Any | None = None
    """Data-parallel training workers (:class:`~gym_bridge.train.data_parallel.TrainingWorkers`) that
    run the updates instead of this process, whose model then mirrors theirs; None trains here."""
    model_lock: Any = field(default_factory=nullcontext)
    """Held for the whole update: the generation backend's lock when it samples from this very model
    (synchronous GRPO), so a late request (one whose rollout the agent loop gave up on) cannot merge
    LoRA adapters into, or run on, weights that are being trained."""

    def __post_init__(self) -> None:
        if self.scaler is None:
            self.scaler = self.placement.grad_scaler()

    @property
    def has_reference(self) -> bool:
        """Whether the loss needs reference log-probs and there is a reference to take them from."""
        return self.reference is not None or (self.peft is not None and self.loss_fn.needs_reference_logprobs)

    @contextmanager
    def reference_policy(self) -> Iterator[Any]:
        """The KL reference to run forward passes on: the frozen copy, or with LoRA the trained model
        itself with its adapters switched off for the duration (the base model, no second copy)."""
        if self.peft is None:
            yield self.reference
            return
        with self.peft.disable_adapter():
            yield self.model


@dataclass
class StepBatch:
    """A step's samples with their advantages, loss mask and (optionally) fixed log-probs."""

    samples: list[Sample]
    advantages: torch.Tensor
    """(b,) advantages from ``grpo.adv_estimator``, of the rewards (``grpo.reward_weights``' sum of the
    reward components when set) after ``grpo.reward_shaping``; with GDPO, of the reward components."""
    sample_mask: torch.Tensor
    """(b,) 1 for samples in the loss: masked samples and, with ``overlong_filtering``, truncated ones
    are out (truncated ones still count in their group's baseline, as in NeMo RL)."""
    prev_logprobs: list[torch.Tensor] | None = None
    """The step-start policy's log-probs; None when the step is one optimizer step (the first forward
    pass's own detached log-probs are then exactly these, which saves a pass)."""
    reference_logprobs: list[torch.Tensor] | None = None
    entropy_coeff: float | None = None
    """This step's entropy-bonus coefficient (adaptive entropy control); None: ``loss_fn.entropy_coeff``."""

    @classmethod
    def from_samples(cls, grpo: GRPOConfig, samples: list[Sample]) -> StepBatch:
        lengths = torch.tensor([float(s.generated_tokens) for s in samples])
        groups = torch.tensor([s.group for s in samples])
        valid = torch.tensor([float(not s.masked) for s in samples])
        if grpo.adv_estimator.takes_components:  # GDPO: several reward components, each normalised in its group
            components, weights, _ = gdpo_components(samples, grpo)
            inputs = AdvantageInputs(components[:, 0], groups, valid, lengths, components, weights)
        else:
            rewards = training_rewards(samples, grpo)  # the verifier's reward, or grpo.reward_weights' sum
            rewards = shape_rewards(rewards, lengths, grpo.reward_shaping)  # DAPO's overlong penalty
            inputs = AdvantageInputs(rewards, groups, valid, lengths)
        advantages = estimate_advantages(inputs, grpo)  # the estimator grpo.adv_estimator.name names
        sample_mask = valid.clone()
        if grpo.overlong_filtering:
            sample_mask *= torch.tensor([float(not s.truncated) for s in samples])
        return cls(samples, advantages, sample_mask)

    def has_advantage(self) -> bool:
        """Whether any sample in the loss has a non-zero advantage (groups whose rewards all tie have none)."""
        return bool(((self.advantages != 0) & (self.sample_mask > 0)).any())


def optimizer_batches(cfg: MasterConfig, num_samples: int) -> list[list[int]]:
    """Sample indices of each optimizer step: ``train_global_batch_size`` at a time, in order."""
    size = cfg.policy.train_global_batch_size
    return [list(range(start, min(start + size, num_samples))) for start in range(0, num_samples, size)]


def _step_scheduler(scheduler: Any) -> None:
    """Advance the LR schedule; torch warns when that precedes any optimizer step, which is intended
    for a skipped update."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)`")
        scheduler.step()


def skip_update(cfg: MasterConfig, learner: Learner, num_samples: int) -> dict[str, float]:
    """No update for a step without learning signal: the schedule still advances by its optimizer steps."""
    if learner.workers is not None:
        learner.workers.skip(num_samples)
    for _ in optimizer_batches(cfg, num_samples):
        _step_scheduler(learner.scheduler)
    return {"optimizer_steps": 0.0, "no_learning_signal": 1.0}


def update_policy(cfg: MasterConfig, learner: Learner, batch: StepBatch) -> dict[str, float]:
    """Optimizer steps over the batch's samples, ``train_global_batch_size`` at a time; their metrics.

    With ``learner.workers`` the data-parallel workers run them and this process's model (and
    optimizer and schedule) take their result.
    """
    if learner.workers is not None:
        return summarize_update(*learner.workers.update(batch))
    with learner.model_lock:
        host = optimizer_steps(cfg, learner, batch)
    return summarize_update(host, learner.scaler.get_scale() if learner.scaler is not None else None)


def optimizer_steps(
    cfg: MasterConfig, learner: Learner, batch: StepBatch, shard: Any = None
) -> list[dict[str, float]]:
    """The optimizer steps of the batch; each one's metrics (summed over its micro-batches).

    Every tensor of the pass is on ``learner.placement.device``: micro-batches are built on the host
    and moved there whole, and metrics stay tensors there until one transfer at the end of the step.
    ``shard`` (data parallel; ``rank``, ``world_size``, ``all_reduce_gradients(params)``): this
    process runs micro-batches ``rank``, ``rank + world_size``, ... of each optimizer step, then the
    gradients are summed over the processes before the (identical) clip and optimizer step; the
    metrics returned are this process's share.

    On CPU the allocator's free pages go back to the OS before the pass (what generation freed) and
    after each micro-batch's backward pass (its activations): :mod:`gym_bridge.models.host_memory`.
    """
    model, samples, place = learner.model, batch.samples, learner.placement
    on_host = place.device.type == "cpu"
    if on_host:
        release_freed_memory(RELEASE_MIN_GAIN)
    model.train()
    share, packing = shares_prompts(cfg, model), packing_layout(cfg)
    max_norm = cfg.policy.max_grad_norm if cfg.policy.max_grad_norm is not None else math.inf
    advantages, sample_mask = place.tensor(batch.advantages), place.tensor(batch.sample_mask)
    step_metrics: list[dict[str, torch.Tensor]] = []
    for batch_index in optimizer_batches(cfg, len(samples)):
        groups = micro_batches(cfg, samples, batch_index, for_logprobs=False, share_prompts=share)
        mbs = [
            make_micro_batch(samples, g, learner.pad_token_id, share_prompts=share, packing=packing) for g in groups
        ]
        # normalisers from the host tensors, before the micro-batches move (no device sync)
        valid_toks = sum(float((mb.token_mask * batch.sample_mask[mb.index].unsqueeze(-1)).sum()) for mb in mbs)
        valid_seqs = float(batch.sample_mask[batch_index].sum())
        if valid_toks == 0:  # nothing to learn from: no optimizer step, but the schedule moves on
            _step_scheduler(learner.scheduler)
            continue
        learner.optimizer.zero_grad(set_to_none=True)
        metrics: list[dict[str, torch.Tensor]] = []
        mine = mbs if shard is None else mbs[shard.rank :: shard.world_size]
        start = None  # the system prompt and worked examples every prompt starts with, run once
        if share:
            with place.autocast():
                start = common_start(model, [mb.prefixes for mb in mine if mb.prefixes is not None], place.device)
        for mb in (mb.to(place.device) for mb in mine):
            width = mb.token_mask.shape[1]
            with place.autocast():
                current = micro_batch_logprobs(
                    model,
                    mb,
                    learner.pad_token_id,
                    cfg.policy.logprob_chunk_size,
                    start,
                    cfg.policy.generation.temperature,
                )
            prev = (
                current.detach()
                if batch.prev_logprobs is None
                else pad_rows([batch.prev_logprobs[i] for i in mb.index], width, place.device)
            )
            generation = mb.generation_logprobs if mb.generation_logprobs is not None else prev
            reference = (
                pad_rows([batch.reference_logprobs[i] for i in mb.index], width, place.device)
                if batch.reference_logprobs
                else None
            )
            loss, mb_metrics = learner.loss_fn.loss_and_metrics(
                current,
                prev_logprobs=prev,
                generation_logprobs=generation * mb.token_mask,
                advantages=advantages[mb.index],
                token_mask=mb.token_mask,
                sample_mask=sample_mask[mb.index],
                reference_logprobs=reference,
                global_valid_toks=valid_toks,
                global_valid_seqs=valid_seqs,
                entropy_coeff=batch.entropy_coeff,
            )
            (learner.scaler.scale(loss) if learner.scaler is not None else loss).backward()
            metrics.append(mb_metrics)
            if on_host:  # this micro-batch's activations, before the next one allocates its own
                release_freed_memory(RELEASE_MIN_GAIN)
        if start is not None:  # the common start's share of every micro-batch's gradients
            start.backward()
        reduced = reduce_microbatch_metrics(metrics)
        if shard is not None:
            shard.all_reduce_gradients(_trainable(learner))
        reduced.update(_optimizer_step(learner, max_norm))
        _step_scheduler(learner.scheduler)  # also after a float16 step the scaler skipped
        step_metrics.append(reduced)
    out = _to_host(step_metrics)
    if on_host:
        release_freed_memory(RELEASE_MIN_GAIN)
    return out


def summarize_update(host: list[dict[str, float]], loss_scale: float | None = None) -> dict[str, float]:
    """The step's update metrics from its optimizer steps' (:func:`optimizer_steps`) and float16's
    loss scale after them."""
    for metrics in host:  # a skipped (overflowed) float16 step applied no gradient: no norm to average
        if metrics.get("amp_skipped_steps"):
            del metrics["grad_norm"]
    out = _mean_over_optimizer_steps(host)
    if loss_scale is not None:
        out["amp_loss_scale"] = float(loss_scale)
    return out


def _trainable(learner: Learner) -> list[torch.Tensor]:
    return [p for group in learner.optimizer.param_groups for p in group["params"]]


def _optimizer_step(learner: Learner, max_norm: float) -> dict[str, torch.Tensor]:
    """Clip and step; with float16's scaler, unscale first and let the scaler skip an overflowed step.

    The scaler skips exactly when an unscaled gradient is inf or NaN, that is when their norm is not
    finite: that is how a skip is counted without asking the device mid-step.
    """
    params = _trainable(learner)
    scaler = learner.scaler
    if scaler is None:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm).detach().float()
        learner.optimizer.step()
        return {"grad_norm": grad_norm}
    scaler.unscale_(learner.optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm).detach().float()
    scaler.step(learner.optimizer)  # skipped when any gradient overflowed
    scaler.update()
    skipped = (~torch.isfinite(grad_norm)).float()
    return {"grad_norm": grad_norm, "amp_skipped_steps": skipped}


def _to_host(step_metrics: list[dict[str, torch.Tensor | float]]) -> list[dict[str, float]]:
    """Every metric of the step as Python floats: the tensors in one device-to-host transfer (a metric a
    loss computed on the host already is taken as it is)."""
    out: list[dict[str, float]] = [
        {key: float(value) for key, value in metrics.items() if not isinstance(value, torch.Tensor)}
        for metrics in step_metrics
    ]
    keys = [(i, key) for i, metrics in enumerate(step_metrics) for key, v in metrics.items() if isinstance(v, torch.Tensor)]
    if not keys:
        return out
    values = torch.stack([step_metrics[i][key].detach().double().reshape(()) for i, key in keys]).tolist()  # type: ignore[union-attr]
    for (i, key), value in zip(keys, values, strict=True):
        out[i][key] = value
    return out


def _mean_over_optimizer_steps(step_metrics: list[dict[str, float]]) -> dict[str, float]:
    """Means over the step's optimizer steps (``*_min`` / ``*_max`` kept as such)."""
    if not step_metrics:
        return {"optimizer_steps": 0}
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for m in step_metrics for k in m):
        values = [m[key] for m in step_metrics if key in m]
        if key == "amp_skipped_steps":  # a count over the step
            out[key] = sum(values)
        elif key.endswith("_min"):
            out[key] = min(values)
        elif key.endswith("_max"):
            out[key] = max(values)
        else:
            out[key] = sum(values) / len(values)
    out["optimizer_steps"] = len(step_metrics)
    out["clip_fraction"] = out.get("clip_fraction_low", 0.0) + out.get("clip_fraction_high", 0.0)
    return out
