"""One process at a time on a run's files: an exclusive ``flock`` on a lock file, held while the run writes.

Why one module: ``collect`` (its ``-o`` file) and ``train`` (its checkpoint and log directories) take the
same lock, and its mechanics are easy to get subtly wrong twice: the kernel drops a ``flock`` with its
process, so a run killed with SIGKILL never leaves a stale lock; the file is removed on release, so a
second run that opened it just before must check it still locks the file on disk (the inode) and else
lock the new one. Where the lock goes, and what a busy lock or a file system without ``flock`` means,
is each caller's own policy.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import TracebackType

__all__ = ["FlockUnsupported", "HeldLock", "LockBusy", "acquire"]


class LockBusy(Exception):
    """Another process holds the lock; ``holder`` is the pid it wrote in the file (``"?"`` if none yet)."""

    def __init__(self, lock: Path, holder: str) -> None:
        super().__init__(f"{lock} is held by pid {holder}")
        self.lock, self.holder = lock, holder


class FlockUnsupported(OSError):
    """The lock file's file system takes no ``flock`` (some network mounts), or the platform has none."""


class HeldLock:
    """A lock this process holds: :meth:`release` (or the end of a ``with`` block) removes the file and drops it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd = path, fd

    def release(self) -> None:
        self.path.unlink(missing_ok=True)
        os.close(self.fd)

    def __enter__(self) -> HeldLock:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def acquire(lock: Path) -> HeldLock:
    """Take the exclusive ``flock`` of ``lock`` (created with its parent directories) without waiting, and
    write this process's pid in it. :class:`LockBusy` when another process holds it,
    :class:`FlockUnsupported` where there is no ``flock`` (the file is not left behind), another
    :class:`OSError` when the file cannot be created or written."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        raise FlockUnsupported(errno.ENOSYS, "no flock on this platform", str(lock)) from None
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise LockBusy(lock, holder) from None
        except OSError as err:
            os.close(fd)
            lock.unlink(missing_ok=True)
            raise FlockUnsupported(err.errno, err.strerror, str(lock)) from None
        try:
            if os.fstat(fd).st_ino == os.stat(lock).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder before removed the file after this process opened it: lock the new one
    held = HeldLock(lock, fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:
        held.release()
        raise
    return held
