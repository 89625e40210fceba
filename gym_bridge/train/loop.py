"""The GRPO training loop, readable top to bottom (in the spirit of CleanRL and nanoGPT).

``train(cfg)`` sets up (:mod:`gym_bridge.train.setup`), then repeats one GRPO step until
``grpo.max_num_steps``:

1. **prompts**: the next ``num_prompts_per_step`` prompts from the training data;
2. **rollouts**: ``num_generations_per_prompt`` completions per prompt from the current policy through
   the agent loop, scored by the resources servers (online), or the step's scored completions from the
   dataset (offline) (:mod:`gym_bridge.train.samplers.sampling`). With async GRPO they were sampled while the
   previous step trained (:mod:`gym_bridge.train.samplers.async_rollouts`);
3. **advantages**: group-relative (leave-one-out baseline, std normalisation); with dynamic sampling,
   groups whose rewards are all equal are dropped and more prompts are generated. A step without any
   non-zero advantage (and no KL penalty or entropy bonus) has no learning signal: it skips the passes
   below;
4. **log-probs**: of the step's starting policy (``prev``) and the reference policy (KL > 0);
5. **updates**: ``train_global_batch_size`` samples per optimizer step (:mod:`gym_bridge.train.learner.update`),
   here or spread over data-parallel workers on Ray (:mod:`gym_bridge.train.data_parallel`);
6. **metrics**, **validation** every ``grpo.val_period`` steps, **checkpoint** every
   ``checkpointing.save_period`` steps. A restarted run resumes from the latest checkpoint.
"""

from __future__ import annotations

import difflib
import functools
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers.utils import logging as hf_logging

from gym_bridge.train.algorithm.entropy_control import EntropyControl
from gym_bridge.train.batches.sequences import per_sample_logprobs
from gym_bridge.train.bookkeeping.checkpoint import CheckpointManager
from gym_bridge.train.bookkeeping.graceful_stop import stop_on_signal
from gym_bridge.train.bookkeeping.logging import MetricsLogger, TerminalView, open_metrics_logger, plot_curves
from gym_bridge.train.bookkeeping.metrics import (
    load_ranked_validation,
    ranked_validator,
    step_summary,
    validate,
)
from gym_bridge.train.bookkeeping.preflight import check_machine
from gym_bridge.train.bookkeeping.run_dirs import find_earlier_run
from gym_bridge.train.bookkeeping.run_lock import hold_run_dirs
from gym_bridge.train.bookkeeping.sample_log import drop_steps_after, write_step_samples
from gym_bridge.train.config import MasterConfig, config_to_yaml
from gym_bridge.train.data_parallel import start_training_workers
from gym_bridge.train.learner.device import generation_precision_notice
from gym_bridge.train.learner.divergence import check_advantages, check_update
from gym_bridge.train.learner.lora import parameter_counts, trainable_parameters_line
from gym_bridge.train.learner.update import Learner, StepBatch, skip_update, update_policy
from gym_bridge.train.samplers.async_rollouts import RolloutPipeline
from gym_bridge.train.samplers.sampling import Sampler, produce_step, sample_step
from gym_bridge.train.setup import (
    build_learner,
    find_resume_point,
    load_run_data,
    start_samplers,
    uses_rollout_process,
    weights_snapshot,
)

__all__ = ["TrainResult", "train"]


@dataclass
class TrainResult:
    """What a finished run reports: where things went and the last metrics."""

    steps: int
    log_dir: Path
    checkpoint_dir: Path | None
    last_train: dict[str, Any] = field(default_factory=dict)
    validations: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: int | None = None
    curves: Path | None = None
    trainable_parameters: tuple[int, int] = (0, 0)
    """(trainable, total) parameters of the policy: all of them, or with LoRA the adapters'."""
    steps_run: int = 0
    """Steps this invocation ran (a resumed run counts from its checkpoint)."""
    steps_updated: int = 0
    """Of those, the steps that took at least one optimizer step (the others had no learning signal)."""


def train(cfg: MasterConfig, *, show_progress: bool = True, fresh: bool = False) -> TrainResult:
    """Run GRPO as configured; resume from the latest checkpoint in ``checkpointing.checkpoint_dir``
    (``fresh``: delete its checkpoints and start at step 0). Raises
    :class:`~gym_bridge.train.setup.RunAlreadyComplete` when that checkpoint is the last step, and
    :class:`~gym_bridge.train.bookkeeping.run_lock.RunDirectoryBusy` when another run holds its directories."""
    with hold_run_dirs(cfg):
        return _train(cfg, show_progress=show_progress, fresh=fresh)


def _train(cfg: MasterConfig, *, show_progress: bool, fresh: bool) -> TrainResult:
    hf_logging.disable_progress_bar()  # no "Writing model shards" bars between metric lines
    grpo, policy = cfg.grpo, cfg.policy
    check_machine(cfg)  # keys this machine cannot honour are refused before the model loads
    ranked_groups = load_ranked_validation(cfg)  # a bad grpo.val_ranked_data_path fails before the model loads
    checkpoints, resume = find_resume_point(cfg, fresh=fresh)
    earlier_run = find_earlier_run(cfg, fresh=fresh, resuming=resume is not None)  # moved aside once all has started
    learner, generation_threads = build_learner(cfg, resume, rollout_process=uses_rollout_process(cfg))
    model = learner.model
    data = load_run_data(cfg, learner.tokenizer)
    ranked = ranked_validator(ranked_groups, model, learner.tokenizer)  # None without ranked groups

    step, validations = 0, []
    entropy = EntropyControl.from_config(cfg.loss_fn)  # the entropy bonus's coefficient, maybe adaptive
    if resume is not None:
        restored = resume.load_training_state(learner.optimizer, learner.scheduler)
        data.train.load_state_dict(restored["data"])
        step = int(restored["info"]["step"])
        validations = list(restored["info"].get("validations", []))
        entropy.load_state_dict(restored["info"].get("entropy_control"))
    log_dir = Path(cfg.logger.log_dir)
    view = TerminalView(grpo.max_num_steps, step, every=cfg.logger.print_every_steps, enabled=show_progress)
    view.print(_where_outputs_go(cfg))
    view.print(trainable_parameters_line(model))
    if notice := generation_precision_notice(cfg):
        view.print(notice)
    if resume is not None:
        view.print(f"resuming from {resume.path} (step {step})")
    if data.dropped:
        view.print(f"dropped {data.dropped} training prompts longer than {data.max_prompt_tokens} tokens")
    if data.validation_dropped:
        view.print(f"dropped {data.validation_dropped} validation prompts longer than {data.max_prompt_tokens} tokens")
    last_train: dict[str, Any] = {}
    last_val: dict[str, Any] = validations[-1] if validations else {}

    with ExitStack() as stack:
        stack.callback(view.close)
        learner.workers = start_training_workers(cfg, stack, learner)  # data parallel on Ray, or None
        if uses_rollout_process(cfg):
            view.print("starting the rollout process (async GRPO) ...")
        train_sampler, val_sampler = start_samplers(
            cfg, stack, learner, generation_threads, needs_validation=bool(data.validation)
        )
        # config, data, model and servers are up: only now does an earlier run make room (said even with -q)
        earlier_run.move_aside(view.print if show_progress else print)
        logger = open_metrics_logger(cfg, resume_step=step if resume else None)
        stack.callback(logger.close)
        if resume is not None:  # the killed run's sample files past the checkpoint go as its metrics lines do
            drop_steps_after(log_dir, step)
        pipeline: RolloutPipeline | None = None
        if grpo.val_at_start and step == 0:
            last_val = run_validation(cfg, val_sampler, data.validation, step, view, logger, validations, ranked) or last_val
        if grpo.mode == "online" and grpo.async_grpo.enabled:
            pipeline = RolloutPipeline(
                functools.partial(produce_step, cfg, train_sampler, data.train),
                train_sampler.load_weights,
                first_step=step + 1,
                last_step=grpo.max_num_steps,
                max_age=grpo.async_grpo.max_trajectory_age_steps,
                initial_version=step,
            )
            stack.callback(pipeline.close)
            pipeline.publish(step, weights_snapshot(model))
        data_state, epochs_done = data.train.state_dict(), data.train.epochs_done
        first_step, steps_updated, said = step, 0, set()
        stop = stack.enter_context(stop_on_signal())  # SIGTERM or Ctrl-C: finish this step, save it, stop

        while step < grpo.max_num_steps and epochs_done < grpo.max_num_epochs:
            step += 1
            step_started = time.perf_counter()

            # 1-2. prompts -> completions and rewards (made ahead of time by the pipeline when async)
            if pipeline is None:
                samples, step_stats = sample_step(cfg, train_sampler, data.train, step)
                data_state, epochs_done = data.train.state_dict(), data.train.epochs_done
            else:
                produced = pipeline.take(step)
                if produced is None:
                    break
                samples, step_stats = produced.samples, dict(produced.stats)
                data_state, epochs_done = produced.data_state, step_stats.pop("epoch")
                step_stats["time_waiting_for_rollouts_s"] = time.perf_counter() - step_started
                step_stats["trajectory_age_steps"] = float(step - 1 - produced.weights_version)
            if not samples:  # dynamic sampling kept no group: no update, but the step, its validation and checkpoint count
                train_metrics = skip_update(cfg, learner, grpo.samples_per_step)
                metrics = {
                    **train_metrics,
                    **step_stats,
                    "num_samples": 0.0,
                    "lr": learner.scheduler.get_last_lr()[0],
                    "time_step_s": time.perf_counter() - step_started,
                    "epoch": epochs_done,
                }
                logger.log(step, metrics)
                view.step(step, metrics)
                if pipeline is not None:  # the sampler waits for a version per step
                    pipeline.publish(step, weights_snapshot(model))
            else:
                # 3. advantages; a step where they are all zero (and no KL or entropy term) has nothing to learn
                batch = StepBatch.from_samples(grpo, samples)
                check_advantages(step, batch.advantages, [s.reward for s in samples], checkpoints)
                batch.entropy_coeff, entropy_stats = entropy.step(samples)
                step_stats.update(entropy_stats)
                if batch.has_advantage() or learner.loss_fn.learns_without_advantage(batch.entropy_coeff):
                    # 4. log-probs of the step's starting policy and of the reference
                    started = time.perf_counter()
                    if len(samples) > policy.train_global_batch_size:  # several optimizer steps
                        batch.prev_logprobs = per_sample_logprobs(
                            cfg, model, samples, learner.pad_token_id, learner.placement.autocast
                        )
                    if learner.has_reference:
                        with learner.reference_policy() as reference:
                            batch.reference_logprobs = per_sample_logprobs(
                                cfg, reference, samples, learner.pad_token_id, learner.placement.autocast
                            )
                    step_stats["time_logprobs_s"] = time.perf_counter() - started

                    # 5. updates
                    started = time.perf_counter()
                    train_metrics = update_policy(cfg, learner, batch)
                    step_stats["time_training_s"] = time.perf_counter() - started
                else:
                    train_metrics = skip_update(cfg, learner, len(samples))
                if pipeline is not None:
                    pipeline.publish(step, weights_snapshot(model))
                elif val_sampler is not None:  # Ray replicas and vLLM refit; a no-op for a shared model
                    val_sampler.load_weights(model)

                # 6. metrics
                metrics = step_summary(
                    samples,
                    batch.advantages,
                    train_metrics,
                    step_stats,
                    lr=learner.scheduler.get_last_lr()[0],
                    step_time=time.perf_counter() - step_started,
                    epoch=epochs_done,
                )
                logger.log(step, metrics)
                write_step_samples(
                    log_dir, step, samples, batch.advantages.tolist(), cfg.logger.num_rollout_groups_to_log
                )
                view.step(step, metrics)
                check_update(step, train_metrics, metrics["lr"], checkpoints)  # before NaN weights are validated or saved
                steps_updated += bool(train_metrics.get("optimizer_steps"))
                data.train.set_records(reward=metrics["reward_mean"], step=step)
                last_train = metrics

            # validation and checkpoint
            last_step = step >= grpo.max_num_steps or epochs_done >= grpo.max_num_epochs
            if (grpo.val_period and step % grpo.val_period == 0) or (last_step and grpo.val_at_end):
                if pipeline is not None:  # validate the trainer's current weights, not the sampler's
                    validated = pipeline.exclusive(
                        weights_snapshot(model),
                        step,
                        functools.partial(
                            run_validation, cfg, val_sampler, data.validation, step, view, logger, validations, ranked
                        ),
                    )
                else:
                    validated = run_validation(cfg, val_sampler, data.validation, step, view, logger, validations, ranked)
                last_val = validated or last_val
            if cfg.checkpointing.enabled and (step % cfg.checkpointing.save_period == 0 or last_step or stop.requested):
                notice = save_checkpoint(
                    cfg, checkpoints, learner, step, data.train.with_records(data_state), metrics, last_val, validations, entropy
                )
                if notice and notice not in said:  # once a run, even with -q
                    said.add(notice)
                    (view.print if show_progress else functools.partial(print, file=sys.stderr))(notice)
            if stop.requested and not last_step:
                saved = f"its checkpoint is {checkpoints.latest().path}" if cfg.checkpointing.enabled else "checkpointing is off"
                raise stop.stopped(
                    f"after step {step} of {grpo.max_num_steps}: {saved}; run the same command to resume"
                )

    return TrainResult(
        steps=step,
        log_dir=log_dir,
        checkpoint_dir=Path(cfg.checkpointing.checkpoint_dir) if cfg.checkpointing.enabled else None,
        last_train=last_train,
        validations=validations,
        resumed_from=resume.step if resume is not None else None,
        curves=plot_curves(log_dir),
        trainable_parameters=parameter_counts(model),
        steps_run=step - first_step,
        steps_updated=steps_updated,
    )


def run_validation(
    cfg: MasterConfig,
    sampler: Sampler | None,
    prompts: list[Any],
    step: int,
    view: TerminalView,
    logger: MetricsLogger,
    validations: list[dict[str, Any]],
    ranked: Callable[[], dict[str, float]] | None = None,
) -> dict[str, float] | None:
    """Validate (prompts through ``sampler``, ranked groups through ``ranked``), log, and append to
    ``validations``; None when there is nothing to validate."""
    metrics = validate(cfg, sampler, prompts, view) if sampler is not None and prompts else {}
    if ranked is not None:
        metrics.update(ranked())
    if not metrics:
        return None
    logger.log(step, metrics, split="val")
    view.step(step, metrics, split="val")
    validations.append({"step": step, **metrics})
    return metrics


def save_checkpoint(
    cfg: MasterConfig,
    checkpoints: CheckpointManager,
    learner: Learner,
    step: int,
    data_state: dict[str, Any],
    metrics: dict[str, Any],
    last_val: dict[str, Any],
    validations: list[dict[str, Any]],
    entropy: EntropyControl,
) -> str | None:
    """Save step ``step``, ranked by its train metrics and the latest validation's; a warning when
    ``checkpointing.metric_name`` is none of them although its split has metrics (a typo would otherwise
    rank every checkpoint as lacking it, and ``keep_top_k`` keep the newest instead of the best)."""
    ranked = {f"train:{k}": v for k, v in metrics.items()}
    ranked.update({f"val:{k}": v for k, v in last_val.items()})
    notice = None
    name, keep = cfg.checkpointing.metric_name, cfg.checkpointing.keep_top_k
    split = f"{name.partition(':')[0]}:" if name else ""
    known = sorted(k for k, v in ranked.items() if k.startswith(split) and isinstance(v, (int, float)))
    if name and keep is not None and name not in ranked and known:
        near = difflib.get_close_matches(name, known, n=1)
        notice = (
            f"warning: checkpointing.metric_name {name!r} is not a metric of this run"
            f"{f' (did you mean {near[0]!r}?)' if near else ''}: checkpoints are ranked by recency only, so "
            f"keep_top_k={keep} keeps the newest, not the best"
            + ("" if near else f". This run's {split} metrics: {', '.join(known[:12])}")
        )
    checkpoints.save(
        step,
        model=learner.model,
        tokenizer=learner.tokenizer,
        optimizer=learner.optimizer,
        scheduler=learner.scheduler,
        data_state=data_state,
        config_yaml=config_to_yaml(cfg),
        metrics={k: v for k, v in ranked.items() if isinstance(v, (int, float))},
        extra_info={"validations": validations, "entropy_control": entropy.state_dict()},
        peft_model=learner.peft,
        save_merged=cfg.checkpointing.save_merged,
    )
    return notice


def _where_outputs_go(cfg: MasterConfig) -> str:
    metrics = Path(cfg.logger.log_dir).resolve() / "metrics.jsonl"
    if not cfg.checkpointing.enabled:
        return f"outputs: metrics in {metrics}; checkpointing off"
    return f"outputs: metrics in {metrics}; checkpoints in {Path(cfg.checkpointing.checkpoint_dir).resolve()}"
