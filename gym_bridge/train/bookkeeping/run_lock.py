"""One run at a time in a run's directories: a second ``gym-bridge train`` on them is refused at start.

Why: two runs on the same ``checkpointing.checkpoint_dir`` both resumed from it; the second one's start-up
deleted the first one's checkpoint being written (``clean_leftovers`` takes any ``.tmp-*`` for a killed
run's), one run's ``keep_top_k`` deleted the checkpoint the other was loading (it crashed with a
traceback), and both appended to one ``metrics.jsonl``. Now each run holds an exclusive ``flock`` on a
hidden ``.<dir>.lock`` beside ``checkpointing.checkpoint_dir`` and beside ``logger.log_dir`` for its whole
life, taken before it looks at either directory. The kernel drops the lock with the process, so a run
killed with SIGKILL never leaves a stale one; the file is removed when the run ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from gym_bridge.records.file_lock import HeldLock, LockBusy, acquire

if TYPE_CHECKING:
    from gym_bridge.train.config import MasterConfig

__all__ = ["RunDirectoryBusy", "hold_run_dirs", "lock_path"]


class RunDirectoryBusy(RuntimeError):
    """Another run holds this run's checkpoint or log directory."""


def lock_path(directory: Path) -> Path:
    """The lock file of a run directory: beside it, so it stays put when ``--fresh`` moves the directory aside."""
    return directory.parent / f".{directory.name}.lock"


INSIDE_LOCK = ".gym-bridge-train.lock"
"""The lock's name inside the directory, where the directory's parent takes no new files."""


def _acquire(key: str, directory: Path, lock: Path) -> HeldLock:
    """``lock``, held (:class:`RunDirectoryBusy` naming ``key`` when another run holds it; OSError when it
    cannot be created or locked)."""
    try:
        return acquire(lock)
    except LockBusy as busy:
        raise RunDirectoryBusy(
            f"{key} is {directory}, which another gym-bridge train (pid {busy.holder}) is still using (its lock "
            f"is {lock}): wait for that run to end, or give this one its own {key}"
        ) from None


@contextmanager
def _hold(key: str, directory: Path) -> Iterator[None]:
    from gym_bridge.train.config import ConfigError

    try:
        held = _acquire(key, directory, lock_path(directory))
    except OSError:  # a parent that takes no new files (a shared mount): the lock goes inside the directory
        try:
            held = _acquire(key, directory, directory / INSIDE_LOCK)
        except OSError as err:
            raise ConfigError([f"{key}: cannot write {directory} ({err.strerror or err})"]) from None
    with held:
        yield


@contextmanager
def hold_run_dirs(cfg: MasterConfig) -> Iterator[None]:
    """Hold the run's checkpoint directory (when checkpointing is on) and log directory for the ``with``
    block; :class:`RunDirectoryBusy` naming the key when another run holds one."""
    try:
        import fcntl  # noqa: F401
    except ImportError:  # pragma: no cover - no flock (Windows): nothing to hold
        yield
        return
    directories: dict[Path, str] = {}
    if cfg.checkpointing.enabled:
        directories[Path(cfg.checkpointing.checkpoint_dir).resolve()] = "checkpointing.checkpoint_dir"
    directories.setdefault(Path(cfg.logger.log_dir).resolve(), "logger.log_dir")
    with ExitStack() as stack:
        for directory in sorted(directories):
            stack.enter_context(_hold(directories[directory], directory))
        yield
