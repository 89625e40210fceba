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

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

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


def _acquire(key: str, directory: Path, lock: Path) -> int:
    """An open descriptor of ``lock`` holding its exclusive flock (OSError when it cannot be created)."""
    import fcntl

    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RunDirectoryBusy(
                f"{key} is {directory}, which another gym-bridge train (pid {holder}) is still using (its lock "
                f"is {lock}): wait for that run to end, or give this one its own {key}"
            ) from None
        try:
            if os.fstat(fd).st_ino == os.stat(lock).st_ino:
                return fd  # else the run before removed the file after this one opened it: lock the new one
        except FileNotFoundError:
            pass
        os.close(fd)


@contextmanager
def _hold(key: str, directory: Path) -> Iterator[None]:
    from gym_bridge.train.config import ConfigError

    lock = lock_path(directory)
    try:
        fd = _acquire(key, directory, lock)
    except RunDirectoryBusy:
        raise
    except OSError:  # a parent that takes no new files (a shared mount): the lock goes inside the directory
        lock = directory / INSIDE_LOCK
        try:
            fd = _acquire(key, directory, lock)
        except RunDirectoryBusy:
            raise
        except OSError as err:
            raise ConfigError([f"{key}: cannot write {directory} ({err.strerror or err})"]) from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)


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
