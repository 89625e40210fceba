"""A run that starts at step 0 never deletes, nor mixes its files with, an earlier run in its directories.

Why: ``--fresh`` used to delete the checkpoints before the new run had read its data, loaded its model
or started its servers, so a typo in a path cost a finished run; and a new run in an old log directory
replaced ``metrics.jsonl`` and ``curves.png`` but kept the old ``rollouts/step_*.jsonl``, so
``gym-bridge view`` showed two runs as one. Now the directories that hold an earlier run are chosen (and
refused, if moving them is unsafe) before anything loads, and moved aside whole to
``<dir>.previous-<UTC time>`` only once everything the new run needs has started. Nothing is deleted.

Which directories: with ``--fresh``, ``checkpointing.checkpoint_dir`` when it holds a run's files; and
``logger.log_dir`` whenever the run starts at step 0 and it holds a run's files (a resumed run continues
its own). One inside the other moves with it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gym_bridge.train.config import MasterConfig

__all__ = ["EarlierRun", "find_earlier_run"]

LOG_FILES = ("metrics.jsonl", "curves.png", "rollouts", "tensorboard", "wandb", "wandb_run_id")
"""What a run writes into ``logger.log_dir`` (:mod:`~gym_bridge.train.bookkeeping.logging`,
:mod:`~gym_bridge.train.bookkeeping.sample_log`)."""
CHECKPOINT_FILES = ("tokenizer",)
"""What a run writes into ``checkpointing.checkpoint_dir`` besides its ``step_<n>`` directories."""
ASIDE_SUFFIX = ".previous-"


def _holds_run(directory: Path, names: tuple[str, ...]) -> bool:
    if not directory.is_dir():
        return False
    return any(
        entry.name in names or (entry.name.startswith("step_") and entry.is_dir()) for entry in directory.iterdir()
    )


def _inside(path: Path, other: Path) -> bool:
    return path == other or other in path.parents


@dataclass
class EarlierRun:
    """The directories of an earlier run to move aside, by the config key that names each."""

    directories: list[tuple[str, Path]] = field(default_factory=list)

    def move_aside(self, say: Callable[[str], None] = print) -> list[tuple[Path, Path]]:
        """Rename each directory to ``<dir>.previous-<UTC time>`` (one ``rename``: atomic, nothing copied or
        deleted), say where it went, and return ``(from, to)`` pairs."""
        moved = []
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        for key, directory in self.directories:
            target = directory.with_name(f"{directory.name}{ASIDE_SUFFIX}{stamp}")
            n = 1
            while target.exists():
                n += 1
                target = directory.with_name(f"{directory.name}{ASIDE_SUFFIX}{stamp}-{n}")
            os.rename(directory, target)
            say(f"starting at step 0: the earlier run in {key} ({directory}) was moved to {target}")
            moved.append((directory, target))
        return moved


def find_earlier_run(cfg: MasterConfig, *, fresh: bool, resuming: bool) -> EarlierRun:
    """The directories a run starting now must move aside before it writes (none when it resumes).

    Raises :class:`~gym_bridge.train.config.ConfigError` naming the key when one of them is the working
    directory, one above it, or the home directory: moving that aside would move far more than a run."""
    from gym_bridge.train.config import ConfigError

    if resuming:
        return EarlierRun()
    candidates: list[tuple[str, Path]] = []
    if fresh and cfg.checkpointing.enabled:
        candidates.append(("checkpointing.checkpoint_dir", Path(cfg.checkpointing.checkpoint_dir).resolve()))
    candidates.append(("logger.log_dir", Path(cfg.logger.log_dir).resolve()))
    found = [
        (key, path)
        for key, path in candidates
        if _holds_run(path, CHECKPOINT_FILES if key.startswith("checkpointing") else LOG_FILES)
    ]
    # one inside another moves with it (the same directory too)
    outer = [(k, p) for k, p in found if not any(q != p and _inside(p, q) for _, q in found)]
    unique: list[tuple[str, Path]] = []
    for key, path in outer:
        if all(path != p for _, p in unique):
            unique.append((key, path))
    cwd, home = Path.cwd().resolve(), Path.home().resolve()
    problems = [
        f"{key} is {path}, which holds an earlier run: starting at step 0 moves it aside whole, and it is "
        f"{'the home directory' if path == home else 'the working directory or one above it'}; give the run "
        "a directory of its own"
        for key, path in unique
        if _inside(cwd, path) or path == home
    ]
    if problems:
        raise ConfigError(problems)
    return EarlierRun(unique)
