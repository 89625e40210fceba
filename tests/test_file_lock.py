"""The run lock's mechanics (:mod:`gym_bridge.records.file_lock`), shared by collect's ``-o`` and train's run
directories: busy naming the holder, released and removed, a lost race with the holder before, no
``flock`` (collect runs unlocked there)."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import Any

import pytest

from gym_bridge.collect.output import output_lock
from gym_bridge.records import file_lock
from gym_bridge.records.file_lock import FlockUnsupported, LockBusy, acquire


def test_a_held_lock_refuses_a_second_taker_naming_the_holder_and_is_removed_on_release(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "deep" / ".run.lock"
    with acquire(lock):
        assert lock.read_text() == f"{os.getpid()}\n"
        # flock is per open file: a second open conflicts within one process too
        with pytest.raises(LockBusy) as busy:
            acquire(lock)
        assert busy.value.holder == str(os.getpid()) and busy.value.lock == lock
    assert not lock.exists()
    acquire(lock).release()  # free again


def test_a_lock_file_removed_by_the_holder_before_is_not_the_one_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder before removed the file after this process opened it: locking the removed file would let
    a third run lock the new one too."""
    lock = tmp_path / ".run.lock"
    real_flock, calls = fcntl.flock, []

    def flock_after_the_holder_left(fd: int, op: int) -> Any:
        calls.append(fd)
        if len(calls) == 1:
            os.unlink(lock)  # the holder before releases between this process's open and its flock
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock_after_the_holder_left)
    with acquire(lock) as held:
        assert len(calls) == 2 and os.fstat(held.fd).st_ino == os.stat(lock).st_ino


def test_no_flock_is_said_and_leaves_no_file_and_collect_runs_unlocked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    lock = tmp_path / ".run.lock"
    with pytest.raises(FlockUnsupported, match="No locks available"):
        acquire(lock)
    assert not lock.exists()
    with output_lock(tmp_path / "rollouts.jsonl"):
        assert not (tmp_path / ".rollouts.jsonl.lock").exists()


def test_a_lock_that_cannot_be_created_is_an_os_error_not_a_busy_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def refused(path: Any, flags: int, mode: int = 0o777) -> int:
        if str(path).endswith(".lock"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, mode)

    monkeypatch.setattr(file_lock.os, "open", refused)
    with pytest.raises(PermissionError):
        acquire(tmp_path / ".run.lock")
