"""Where a GRPO run's numbers go: the terminal, ``metrics.jsonl``, TensorBoard and a final PNG.

* ``<log_dir>/metrics.jsonl``: one line per step (``{"step", "split": "train"|"val", ...}``), flushed
  as it is written. On resume, lines of steps after the checkpoint are dropped first, so the file
  reads as one uninterrupted run.
* TensorBoard event files in ``<log_dir>/tensorboard`` (``logger.tensorboard_enabled``), purged
  past the resumed step.
* Weights & Biases (``logger.wandb_enabled``, the ``[wandb]`` extra): every record as
  ``<split>/<metric>`` at its step, the resolved config as the run's config, files under
  ``<log_dir>/wandb``. A resumed run continues the same W&B run (its id is kept in
  ``<log_dir>/wandb_run_id``). ``WANDB_MODE=offline`` logs without network.
* GPU utilisation and memory in every train record (``logger.monitor_gpus``, :mod:`gpu_monitor`).
* The terminal: a rich progress bar with the step's key numbers, and a compact line per step with
  each phase's share of the step's wall (``s/step 20.1 (gen 45% rew 5% lp 10% upd 40%)``).
* ``<log_dir>/curves.png``: mean reward per step and validation accuracy, drawn at the end
  (matplotlib's Agg backend, no display needed).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_bridge.records.jsonl import JsonlWriter, iter_jsonl, repair_torn_tail

if TYPE_CHECKING:
    from gym_bridge.train.config import MasterConfig

__all__ = [
    "MetricsLogger",
    "TerminalView",
    "format_line",
    "open_metrics_logger",
    "open_wandb_run",
    "phase_shares",
    "plot_curves",
    "read_metrics",
]

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
WANDB_RUN_ID_FILE = "wandb_run_id"
WANDB_INSTALL_HINT = "pip install 'gym-bridge[wandb]'"


def read_metrics(log_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All records of ``<log_dir>/metrics.jsonl`` (empty when there is none)."""
    path = Path(log_dir) / METRICS_FILE
    if not path.exists():
        return []
    return [rec for _, rec in iter_jsonl(path, strict=False)]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class MetricsLogger:
    """Writes each step's metrics to JSONL and (optionally) TensorBoard and a W&B run.

    ``resume_step``: the step a resumed run restarts after; records of later steps are removed.
    ``wandb_run``: a started ``wandb`` run (:func:`open_wandb_run`), finished by :meth:`close`.
    ``gpu_monitor``: a :class:`~gym_bridge.train.bookkeeping.gpu_monitor.GpuMonitor` whose readings join every
    train record.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        *,
        tensorboard: bool = False,
        resume_step: int | None = None,
        wandb_run: Any = None,
        gpu_monitor: Any = None,
    ) -> None:
        self.wandb_run = wandb_run
        self.gpu_monitor = gpu_monitor
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / METRICS_FILE
        if resume_step is None:
            path.unlink(missing_ok=True)
        else:
            self._truncate_after(path, resume_step)
        self._jsonl = JsonlWriter(path, append=True)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = resume_step + 1 if resume_step is not None else None
            self._tb = SummaryWriter(str(self.log_dir / "tensorboard"), purge_step=purge)

    @staticmethod
    def _truncate_after(path: Path, step: int) -> None:
        if not path.exists():
            return
        repair_torn_tail(path)
        kept = [rec for _, rec in iter_jsonl(path, strict=False) if rec.get("step", 0) <= step]
        tmp = path.with_suffix(".jsonl.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for rec in kept:
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        os.replace(tmp, path)

    def log(self, step: int, metrics: dict[str, Any], split: str = "train") -> None:
        if self.gpu_monitor is not None and split == "train":
            metrics = {**metrics, **self.gpu_monitor.read()}
        self._jsonl.write({"step": step, "split": split, **metrics})
        if self._tb is not None:
            for key, value in metrics.items():
                if _finite(value):
                    self._tb.add_scalar(f"{split}/{key}", value, step)
            self._tb.flush()
        if self.wandb_run is not None:
            self.wandb_run.log({f"{split}/{k}": v for k, v in metrics.items() if _finite(v)}, step=step)

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self.gpu_monitor is not None:
            self.gpu_monitor.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()


def open_wandb_run(cfg: MasterConfig, log_dir: Path, *, resuming: bool) -> Any:
    """A W&B run named by ``logger.wandb`` with the resolved config, or a ConfigError naming
    ``logger.wandb_enabled`` with the install hint when ``wandb`` is missing."""
    from gym_bridge.train.config import ConfigError, config_to_dict

    try:
        import wandb
    except ImportError:
        raise ConfigError(
            [f"logger.wandb_enabled needs the wandb package: {WANDB_INSTALL_HINT} (or set it to false)"]
        ) from None
    id_file = log_dir / WANDB_RUN_ID_FILE
    run_id = id_file.read_text().strip() if resuming and id_file.is_file() else None
    if not run_id:
        run_id = secrets.token_hex(4)  # W&B run ids: lower-case letters and digits
        id_file.write_text(run_id + "\n")
    return wandb.init(
        project=cfg.logger.wandb.project,
        name=cfg.logger.wandb.name,
        config=config_to_dict(cfg),
        dir=str(log_dir),
        id=run_id,
        resume="allow",
    )


def open_metrics_logger(cfg: MasterConfig, resume_step: int | None = None) -> MetricsLogger:
    """The run's :class:`MetricsLogger` as ``logger`` configures it (a ConfigError naming the key when
    W&B or GPU monitoring cannot run here)."""
    log_dir = Path(cfg.logger.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    monitor = None
    if cfg.logger.monitor_gpus:
        from gym_bridge.train.bookkeeping.gpu_monitor import open_gpu_monitor

        monitor = open_gpu_monitor()
    try:
        run = open_wandb_run(cfg, log_dir, resuming=resume_step is not None) if cfg.logger.wandb_enabled else None
    except BaseException:
        if monitor is not None:
            monitor.close()
        raise
    return MetricsLogger(
        log_dir,
        tensorboard=cfg.logger.tensorboard_enabled,
        resume_step=resume_step,
        wandb_run=run,
        gpu_monitor=monitor,
    )


STEP_PHASES: tuple[tuple[str, str, str], ...] = (
    ("generation", "time_generation_s", "gen"),
    ("reward_and_http", "time_reward_and_http_s", "rew"),
    ("logprobs", "time_logprobs_s", "lp"),
    ("update", "time_training_s", "upd"),
)
"""A synchronous step's phases, in order: (name, timing metric, short label on the step line)."""

ASYNC_STEP_PHASES: tuple[tuple[str, str, str], ...] = (
    ("waiting_for_rollouts", "time_waiting_for_rollouts_s", "wait"),
    ("logprobs", "time_logprobs_s", "lp"),
    ("update", "time_training_s", "upd"),
)
"""An async-GRPO step's phases: its rollouts were generated and scored while the previous step trained,
so the trainer's wall is the wait for them, log-probs and the update."""

STEP_SHARE = "step_share/{}"
"""Key of a phase's fraction of ``time_step_s`` in metrics.jsonl (``other``: what no phase timed)."""


def phase_shares(metrics: dict[str, Any]) -> dict[str, float]:
    """Each phase's fraction of the step's wall time (``time_step_s``), plus ``other`` for the rest
    (sample bookkeeping, advantages); empty without a step time. Shows where a step's wall goes."""
    step_time = metrics.get("time_step_s")
    if not _finite(step_time) or step_time <= 0:
        return {}
    phases = ASYNC_STEP_PHASES if "time_waiting_for_rollouts_s" in metrics else STEP_PHASES
    shares = {name: metrics[key] / step_time for name, key, _ in phases if _finite(metrics.get(key))}
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


def _phase_split(metrics: dict[str, Any]) -> str:
    """``gen 45% rew 5% lp 10% upd 40%``: phases under 0.5% are left out, and ``etc N%`` is added when
    untimed work is 5% or more of the step."""
    shares = phase_shares(metrics)
    phases = ASYNC_STEP_PHASES if "time_waiting_for_rollouts_s" in metrics else STEP_PHASES
    parts = [f"{label} {shares[name]:.0%}" for name, _, label in phases if shares.get(name, 0.0) >= 0.005]
    if shares.get("other", 0.0) >= 0.05:
        parts.append(f"etc {shares['other']:.0%}")
    return " ".join(parts)


# Shown on the terminal line, in this order, when present: (metric key, label, format).
TERMINAL_FIELDS: list[tuple[str, str, str]] = [
    ("reward_mean", "reward", "{:.3f}"),
    ("loss", "loss", "{:+.4f}"),
    ("kl_penalty", "kl", "{:.4f}"),
    ("clip_fraction", "clip", "{:.3f}"),
    ("grad_norm", "gnorm", "{:.3f}"),
    ("gen_kl_error", "genKL", "{:.1e}"),
    ("gen_length_mean", "len", "{:.1f}"),
    ("time_step_s", "s/step", "{:.2f}"),
]


HIDDEN_WHEN_ZERO = frozenset({"kl_penalty", "gen_kl_error"})
"""Left off the line when exactly zero (no KL penalty; generation and training log-probs agree)."""


def format_line(step: int, metrics: dict[str, Any], split: str = "train") -> str:
    """A compact one-line summary of a step's metrics."""
    if split == "val":
        parts = [f"{k}={v:.3f}" for k, v in metrics.items() if _finite(v) and "accuracy" in k]
        return f"step {step:>4} [val]   " + "  ".join(parts)
    parts = []
    for key, label, fmt in TERMINAL_FIELDS:
        value = metrics.get(key)
        if _finite(value) and (value != 0 or key not in HIDDEN_WHEN_ZERO):
            parts.append(f"{label} {fmt.format(value)}")
    split_line = _phase_split(metrics)
    if split_line and parts and parts[-1].startswith("s/step"):
        parts[-1] += f" ({split_line})"
    # generated tokens per second of generation; without a generation time (offline steps), per step
    if _finite(metrics.get("generation_tokens_per_s")):
        parts.append(f"gen tok/s {metrics['generation_tokens_per_s']:.0f}")
    elif _finite(metrics.get("tokens_per_s")):
        parts.append(f"step tok/s {metrics['tokens_per_s']:.0f}")
    if _finite(metrics.get("rollout_failures")):  # online steps: failed rollouts were dropped
        requested = metrics.get("rollouts_requested")
        of = f"/{requested:.0f}" if _finite(requested) else ""
        batches = metrics.get("generation_batches")  # dynamic sampling: n counts every batch drawn
        drawn = f" ({batches:.0f} batches)" if _finite(batches) and batches > 1 else ""
        parts.append(f"failed {metrics['rollout_failures']:.0f}{of}{drawn}")
        if metrics.get("rollouts_masked"):  # the env set mask_sample (a judge failed): out of the loss
            parts.append(f"masked {metrics['rollouts_masked']:.0f}{of}")
        if metrics.get("rollouts_timed_out"):  # cut off at grpo.rollout_timeout_s (counted in failed
            parts.append(f"timed_out {metrics['rollouts_timed_out']:.0f}{of}")  # unless scored zero)
            if metrics.get("groups_dropped_for_timeout"):
                parts.append(f"groups_dropped {metrics['groups_dropped_for_timeout']:.0f}")
        if metrics.get("request_retries"):  # requests sent again (after a timeout, a 5xx, a reset)
            parts.append(f"retries {metrics['request_retries']:.0f}")
    for key, value in metrics.items():  # reward_component/<name>_mean, one per verifier component
        if key.startswith("reward_component/") and _finite(value):
            parts.append(f"{key[len('reward_component/'):-len('_mean')]} {value:.3f}")
    if metrics.get("no_learning_signal"):
        parts.append("no learning signal (every group's rewards tie): update skipped")
    return f"step {step:>4} [train] " + "  ".join(parts)


class TerminalView:
    """A rich progress bar over the run's steps, with a line of metrics printed above it every ``every``
    steps, and after any step when the last line is ``quiet_s`` seconds old (slow runs show each step)."""

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        *,
        every: int = 1,
        enabled: bool = True,
        quiet_s: float = 10.0,
    ) -> None:
        self.every = every
        self.quiet_s = quiet_s
        self._last_line = time.monotonic()
        self.enabled = enabled
        self._progress = None
        self._val_accuracy: float | None = None  # the latest ones, shown beside the progress bar
        self._val_tenths = 0  # tenths of the running validation already reported
        self._reward = float("nan")
        if enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            from gym_bridge.console import console

            self._progress = Progress(
                TextColumn("[bold]GRPO"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[summary]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console(),  # piped: step lines whole, not cut at 80 columns
                transient=False,
            )
            self._task = self._progress.add_task("train", total=total_steps, completed=start_step, summary="")
            self._progress.start()

    def print(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text, highlight=False, markup=False, soft_wrap=True)
        elif self.enabled:
            print(text, flush=True)

    def step(self, step: int, metrics: dict[str, Any], split: str = "train") -> None:
        if not self.enabled:
            return
        if split == "val" and _finite(metrics.get("accuracy")):
            self._val_accuracy = metrics["accuracy"]
        if split == "train":
            self._reward = metrics.get("reward_mean", float("nan"))
        if self._progress is not None:
            summary = f"reward {self._reward:.3f}"
            if self._val_accuracy is not None:
                summary += f"  val acc {self._val_accuracy:.3f}"
            completed = step if split == "train" else None  # None: unchanged
            self._progress.update(self._task, completed=completed, summary=summary)
        quiet_too_long = time.monotonic() - self._last_line >= self.quiet_s
        if split == "val" or step % self.every == 0 or quiet_too_long or metrics.get("no_learning_signal"):
            self.print(format_line(step, metrics, split))
            self._last_line = time.monotonic()

    def validation_progress(self, done: int, total: int, elapsed_s: float) -> None:
        """How far a validation of ``total`` prompts has come (``done`` at 0 when it starts): beside the bar
        on a terminal; elsewhere (pipes, logs) a line at the start and at each tenth of the prompts
        (``validation: 50/200 prompts, 45 s``), so minutes of validation do not pass in silence."""
        if not self.enabled:
            return
        if self._progress is not None and self._progress.console.is_terminal:
            self._progress.update(self._task, summary=f"validation {done}/{total} prompts")
            return
        if done == 0:
            self._val_tenths = 0
            self.print(f"validation: {total} prompts ...")
        elif done * 10 // total > self._val_tenths:
            self._val_tenths = done * 10 // total
            self.print(f"validation: {done}/{total} prompts, {elapsed_s:.0f} s")

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def plot_curves(log_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> Path | None:
    """Draw mean reward per step and validation accuracy per dataset into ``curves.png``.

    Returns the path, or None when there is nothing to draw.
    """
    records = read_metrics(log_dir)
    train = [
        (r["step"], r["reward_mean"])
        for r in records
        if r.get("split") == "train" and _finite(r.get("reward_mean"))
    ]
    val: dict[str, list[tuple[int, float]]] = {}
    for rec in records:
        if rec.get("split") != "val":
            continue
        for key, value in rec.items():
            if "accuracy" in key and _finite(value):
                val.setdefault(key, []).append((rec["step"], value))
    if not train and not val:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    if train:
        steps, rewards = zip(*train, strict=True)
        ax.plot(steps, rewards, color="tab:blue", alpha=0.35, linewidth=1, label="train reward (per step)")
        window = max(1, len(rewards) // 15)
        smooth = [
            sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1])
            for i in range(len(rewards))
        ]
        ax.plot(steps, smooth, color="tab:blue", linewidth=2, label=f"train reward ({window}-step mean)")
    colors = ["tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown"]
    for i, (key, points) in enumerate(sorted(val.items())):
        steps, values = zip(*points, strict=True)
        label = "validation " + key.replace("/", " ", 1)
        label += f" ({values[0]:.2f} -> {values[-1]:.2f})" if len(values) > 1 else ""
        ax.plot(steps, values, marker="o", color=colors[i % len(colors)], linewidth=2, label=label)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward / accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("gym-bridge GRPO")
    fig.tight_layout()
    path = Path(out) if out is not None else Path(log_dir) / CURVES_FILE
    fig.savefig(path)
    plt.close(fig)
    return path
