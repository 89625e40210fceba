"""SIGTERM (a preemption, ``docker stop``, Slurm's time limit) ends the step in progress, saves it, and exits.

Why: SIGTERM used to kill the run where it stood (exit 143), losing every step since the last checkpoint:
up to ``checkpointing.save_period - 1`` of them (49 with the tiny recipe). Now the first SIGTERM is
noted, the current step finishes, a checkpoint of it is written (when checkpointing is on) and the run
stops with :class:`TrainingStopped`; ``gym-bridge train`` exits 143 and the same command resumes. A second
SIGTERM kills at once, as before (the atomic checkpoint writes keep whatever is on disk whole). The rollout
process of async GRPO ignores SIGTERM (a signal to the process group reaches it too) and ends when the
trainer closes its pipe.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["StopRequest", "TrainingStopped", "stop_on_sigterm"]


class TrainingStopped(RuntimeError):
    """The run stopped at a step boundary on SIGTERM (its last step saved when checkpointing is on)."""


class StopRequest:
    """Whether a SIGTERM asked the run to stop (set by the handler :func:`stop_on_sigterm` installs)."""

    def __init__(self) -> None:
        self.requested = False

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once


@contextmanager
def stop_on_sigterm() -> Iterator[StopRequest]:
    """A :class:`StopRequest` that the first SIGTERM sets, for the ``with`` block (a handler can only be
    installed from the main thread: elsewhere the request is never set and SIGTERM acts as before)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = signal.signal(signal.SIGTERM, request._handle)
    try:
        yield request
    finally:
        signal.signal(signal.SIGTERM, previous)
