"""What a step and a validation report: rewards, advantages, lengths, timings and accuracy."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from itertools import islice
from typing import Any

import torch

from gym_bridge.records.seeding import rollout_seed
from gym_bridge.train.algorithm.reward_components import components_of
from gym_bridge.train.batches.rollouts import Sample
from gym_bridge.train.bookkeeping.logging import STEP_SHARE, TerminalView, phase_shares
from gym_bridge.train.config import MasterConfig
from gym_bridge.train.samplers.data import Prompt
from gym_bridge.train.samplers.sampling import Sampler

__all__ = [
    "component_metrics",
    "load_ranked_validation",
    "ranked_validation",
    "ranked_validator",
    "sample_metrics",
    "validate",
]

RANKED_METRICS = ("pairwise_accuracy", "top1_accuracy", "kendall_tau", "rankable_groups", "pairs")
"""What ranked validation logs (as ``ranked/<name>``), the same numbers ``gym-bridge eval ranked`` reports."""

COMPONENT_METRIC = "reward_component/{}_mean"
"""Key of a reward component's mean in the step line and metrics.jsonl."""


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = _mean(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def component_metrics(samples: list[Sample]) -> dict[str, float]:
    """``reward_component/<name>_mean`` per reward component, over the samples whose verifier returned it."""
    values: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        for name, value in (components_of(s) or {}).items():
            values[name].append(float(value))
    return {COMPONENT_METRIC.format(name): _mean(values[name]) for name in sorted(values)}


def sample_metrics(samples: list[Sample], advantages: torch.Tensor) -> dict[str, float]:
    """Reward, advantage and length statistics of a step's samples (reward per task with several)."""
    rewards = [s.reward for s in samples]
    lengths = [s.generated_tokens for s in samples]
    metrics = {
        "reward_mean": _mean(rewards),
        "reward_std": float(_std(rewards)),
        "advantage_mean": float(advantages.mean()),
        "advantage_std": float(advantages.std()) if len(samples) > 1 else 0.0,
        "advantage_min": float(advantages.min()),
        "advantage_max": float(advantages.max()),
        "gen_length_mean": _mean(lengths),
        "gen_length_max": float(max(lengths)),
        "sequence_length_mean": _mean([len(s.token_ids) for s in samples]),
        "truncation_rate": _mean([float(s.truncated) for s in samples]),
        "num_samples": float(len(samples)),
        **component_metrics(samples),
    }
    by_task: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        by_task[s.task_name].append(s.reward)
    if len(by_task) > 1:
        for task, values in by_task.items():
            metrics[f"reward_mean/{task}"] = _mean(values)
    return metrics


def validate(
    cfg: MasterConfig, sampler: Sampler, prompts: list[Prompt], view: TerminalView
) -> dict[str, float]:
    """Accuracy (mean reward, samples the env masked left out and counted in ``num_masked``) per
    validation dataset: one completion per prompt, seeded by the prompt's
    position only (``rollout_seed(seed, 0, 0, i, 0)``; training steps count from 1), so every
    validation of a run sees the same draws."""
    if not prompts:
        return {}
    limit = cfg.grpo.max_val_samples or len(prompts)
    chosen = prompts[:limit]
    batch = cfg.grpo.val_batch_size or len(chosen)
    started = time.perf_counter()
    samples: list[Sample] = []
    view.validation_progress(0, len(chosen), 0.0)
    for start in range(0, len(chosen), batch):
        part = chosen[start : start + batch]
        seeds = [[rollout_seed(cfg.grpo.seed, 0, 0, start + i, 0)] for i in range(len(part))]
        got, _ = sampler.sample(part, seeds, group_offset=start)
        samples.extend(got)
        view.validation_progress(start + len(part), len(chosen), time.perf_counter() - started)
    # A sample the env masked (mask_sample: a judge that failed) has no verdict: its reward 0 is not a
    # wrong answer, and counting it would lower the metric checkpoints are ranked by. The means are over
    # the others; num_masked says how many were left out (a validation all masked stops the run).
    scored = [s for s in samples if not s.masked]
    rewards_by_dataset: dict[str, list[float]] = {s.dataset: [] for s in samples}
    for s in scored:
        rewards_by_dataset[s.dataset].append(s.reward)
    metrics: dict[str, float] = {
        "accuracy": _mean([s.reward for s in scored]),
        "num_samples": float(len(samples)),
        "num_masked": float(len(samples) - len(scored)),
        "gen_length_mean": _mean([float(s.generated_tokens) for s in samples]),
        "time_validation_s": time.perf_counter() - started,
        **component_metrics(scored),
    }
    if len(rewards_by_dataset) > 1:
        for name, rewards in rewards_by_dataset.items():
            metrics[f"accuracy/{name}"] = _mean(rewards)
    for s in samples[: cfg.logger.num_val_samples_to_print]:
        text = sampler.tokenizer.decode(
            [t for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m], skip_special_tokens=True
        )
        question = (s.record or {}).get("question") or ""
        view.print(f"  [val sample] {question!r} -> {text!r} reward={s.reward:g}")
    return metrics


def load_ranked_validation(cfg: MasterConfig) -> list[tuple[int, dict[str, Any]]]:
    """The first ``max_val_samples`` groups of ``grpo.val_ranked_data_path`` (none when unset), read and
    checked before training starts so a bad line fails at once, naming the key, file and line."""
    from gym_bridge.evaluation.ranked import iter_ranked
    from gym_bridge.records.jsonl import JsonlError
    from gym_bridge.train.config import ConfigError

    path = cfg.grpo.val_ranked_data_path
    if not path:
        return []
    try:
        groups = list(islice(iter_ranked(path), cfg.grpo.max_val_samples))
    except (JsonlError, OSError) as err:
        raise ConfigError([f"grpo.val_ranked_data_path: {err}"]) from None
    if not groups:
        raise ConfigError([f"grpo.val_ranked_data_path: {path} has no ranked groups"])
    return groups


def ranked_validation(groups: list[tuple[int, dict[str, Any]]], model: Any, tokenizer: Any) -> dict[str, float]:
    """Group ranking metrics of the policy on ``groups``, through the code of ``gym-bridge eval ranked``
    (:class:`~gym_bridge.evaluation.scoring.ModelScorer` and
    :func:`~gym_bridge.evaluation.ranked.evaluate_ranked`), so the two report the same figures."""
    from gym_bridge.evaluation.ranked import evaluate_ranked
    from gym_bridge.evaluation.scoring import ModelScorer

    started = time.perf_counter()
    summary = evaluate_ranked(groups, ModelScorer(model, tokenizer)).summary()
    metrics = {f"ranked/{k}": float("nan") if summary[k] is None else float(summary[k]) for k in RANKED_METRICS}
    metrics["time_ranked_validation_s"] = time.perf_counter() - started
    return metrics


def ranked_validator(
    groups: list[tuple[int, dict[str, Any]]], model: Any, tokenizer: Any
) -> Callable[[], dict[str, float]] | None:
    """A no-argument callable giving the ranked validation metrics of ``model`` as it is when called;
    None without groups (``grpo.val_ranked_data_path`` unset)."""
    if not groups:
        return None
    return lambda: ranked_validation(groups, model, tokenizer)


def step_summary(
    samples: list[Sample],
    advantages: torch.Tensor,
    train_metrics: dict[str, float],
    step_stats: dict[str, float],
    *,
    lr: float,
    step_time: float,
    epoch: int,
) -> dict[str, Any]:
    """The step's metrics line: sample statistics, the update's metrics, timings and throughput, and
    each phase's share of the step (``step_share/<phase>``,
    :func:`~gym_bridge.train.bookkeeping.logging.phase_shares`)."""
    generated = sum(s.generated_tokens for s in samples)
    metrics: dict[str, Any] = {
        **sample_metrics(samples, advantages),
        **train_metrics,
        **step_stats,
        "lr": lr,
        "time_step_s": step_time,
        "tokens_per_s": generated / step_time if step_time > 0 else float("nan"),
        "epoch": epoch,
    }
    if step_stats.get("time_generation_s"):
        metrics["generation_tokens_per_s"] = generated / step_stats["time_generation_s"]
    metrics.update({STEP_SHARE.format(name): share for name, share in phase_shares(metrics).items()})
    return metrics
