"""``gym-bridge train --config FILE [section.key=value ...]``: GRPO with the embedded trainer.

The config is NeMo RL's layout (see ``recipes/`` and ``gym_bridge/train/config/``); overrides use
NeMo RL's dotted syntax. A bad key fails before anything heavy is loaded, naming its full path.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

import typer


def train(
    config: Annotated[
        Path, typer.Option("--config", "-c", help="YAML recipe (e.g. recipes/grpo_math_tiny.yaml).")
    ],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="Dotted overrides, e.g. grpo.max_num_steps=50 policy.optimizer.kwargs.lr=2e-4."),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or per-step lines.")] = False,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="Start at step 0 instead of resuming. Once the config, data, model and servers are all up, the "
            "earlier run's checkpointing.checkpoint_dir and logger.log_dir are moved aside to "
            "<dir>.previous-<UTC time> (nothing is deleted; a run that cannot start leaves them as they were).",
        ),
    ] = False,
    show_config: Annotated[
        bool,
        typer.Option(
            "--show-config",
            help="Print the resolved config (inheritance, interpolation and overrides applied; every key "
            "with its value) as YAML and exit without training.",
        ),
    ] = False,
) -> None:
    """Train a policy with GRPO: online through the resources servers, or offline from scored rollouts.

    The recipe uses NeMo RL's config layout. Every key, with its meaning and default, is documented in
    gym_bridge/train/config/ (the schema's field docstrings); recipes/ holds working examples. An
    unknown or mistyped key fails at start-up naming its full path.
    """
    from gym_bridge.train.config import ConfigError, config_to_yaml, load_config

    try:
        cfg = load_config(config, overrides or [])
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if show_config:
        typer.echo(config_to_yaml(cfg), nl=False)
        return

    from gym_bridge.distributed.ray_cluster import RayClusterError
    from gym_bridge.distributed.ray_local import RayUnavailableError
    from gym_bridge.generation.vllm_backend import VllmUnavailableError
    from gym_bridge.models.registry import ModelNotFoundError
    from gym_bridge.records.jsonl import WriteFailed
    from gym_bridge.train.bookkeeping.checkpoint import CheckpointDamaged, CheckpointWriteError
    from gym_bridge.train.bookkeeping.graceful_stop import TrainingStopped
    from gym_bridge.train.bookkeeping.run_lock import RunDirectoryBusy
    from gym_bridge.train.learner.divergence import TrainingDiverged
    from gym_bridge.train.loop import train as run_training
    from gym_bridge.train.samplers.data import DataError
    from gym_bridge.train.samplers.rollout_failures import TooManyFailedRollouts
    from gym_bridge.train.samplers.rollout_worker import RolloutProcessDied
    from gym_bridge.train.setup import RunAlreadyComplete

    try:
        result = run_training(cfg, show_progress=not quiet, fresh=fresh)
    except RunAlreadyComplete as exc:
        typer.echo(str(exc))
        return
    except TrainingStopped as exc:  # SIGTERM or Ctrl-C: the step in progress finished and was saved
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(128 + exc.signum) from None
    except KeyboardInterrupt:  # Ctrl-C before the first step (loading, servers): nothing of this run to save
        typer.echo("error: interrupted by Ctrl-C while the run was starting; nothing new was trained or saved", err=True)
        raise typer.Exit(128 + signal.SIGINT) from None
    except (
        CheckpointDamaged, CheckpointWriteError, ConfigError, DataError, ModelNotFoundError, RayClusterError,
        RayUnavailableError, RolloutProcessDied, RunDirectoryBusy, TooManyFailedRollouts, TrainingDiverged,
        VllmUnavailableError, WriteFailed,
    ) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"done: {result.steps} steps; metrics in {result.log_dir / 'metrics.jsonl'}")
    if result.steps < cfg.grpo.max_num_steps:  # the other stop condition: said, not left to be noticed
        typer.echo(
            f"stopped before grpo.max_num_steps={cfg.grpo.max_num_steps}: grpo.max_num_epochs="
            f"{cfg.grpo.max_num_epochs} passes over the training data are done"
        )
    if result.steps_run and not result.steps_updated:  # a run that learned nothing is said, not passed over
        typer.echo(
            f"warning: none of this run's {result.steps_run} steps updated the policy: in every step all "
            "rewards of each group were equal (or no rollout became a sample), so there was no learning "
            "signal and the weights are unchanged. Check the rewards (reward_mean, rollout_failures in "
            "metrics.jsonl): a task too hard or too easy for the model, or an environment that scores "
            "every answer alike",
            err=True,
        )
    if result.validations:
        first, last = result.validations[0], result.validations[-1]
        typer.echo(
            f"validation accuracy: {first.get('accuracy', float('nan')):.3f} (step {first['step']}) -> "
            f"{last.get('accuracy', float('nan')):.3f} (step {last['step']})"
        )
    if result.curves is not None:
        typer.echo(f"curves: {result.curves}")
    if result.checkpoint_dir is not None:
        typer.echo(f"checkpoints: {result.checkpoint_dir}")
