"""SIGTERM (a preemption, ``docker stop``, Slurm's time limit) or Ctrl-C ends the step in progress, saves
it, and exits.

Why: SIGTERM used to kill the run where it stood (exit 143), and Ctrl-C ended it in a ``KeyboardInterrupt``
traceback; both lost every step since the last checkpoint: up to ``checkpointing.save_period - 1`` of them
(49 with the tiny recipe). Now the first SIGTERM or SIGINT is noted (a Ctrl-C is acknowledged on stderr at
once, so that no one presses it again thinking it went unheard), the current step finishes, a checkpoint of
it is written (when checkpointing is on) and the run stops with :class:`TrainingStopped`; ``gym-bridge
train`` exits 143 (SIGTERM) or 130 (SIGINT) and the same command resumes. A second signal of either kind
ends the process at once, by that signal, without a traceback (the atomic checkpoint writes keep whatever
is on disk whole). The rollout process of async GRPO ignores both (a signal to the process group, as a
terminal's Ctrl-C is, reaches it too) and ends when the trainer closes its pipe.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["STOP_SIGNALS", "StopRequest", "TrainingStopped", "stop_on_signal"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals whose first arrival finishes the step and saves it."""

_ACKNOWLEDGED = b"\nCtrl-C: finishing this step and saving it, then stopping (Ctrl-C again stops at once)\n"


class TrainingStopped(RuntimeError):
    """The run stopped at a step boundary on a signal (its last step saved when checkpointing is on);
    ``signum`` is that signal, for the exit status (128 + ``signum``)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


class StopRequest:
    """Whether SIGTERM or SIGINT asked the run to stop, and which (set by the handler
    :func:`stop_on_signal` installs)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def stopped(self, where: str) -> TrainingStopped:
        """The error that ends the run: ``stopped by SIGTERM <where>`` (``SIGINT (Ctrl-C)`` for a Ctrl-C)."""
        signum = self.signum or signal.SIGTERM
        said = "SIGINT (Ctrl-C)" if signum == signal.SIGINT else "SIGTERM"
        return TrainingStopped(f"stopped by {said} {where}", signum)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        # a second signal ends the process at once, by that signal (exit 143 or 130)
        for each in STOP_SIGNALS:
            signal.signal(each, signal.SIG_DFL)
        if signum == signal.SIGINT:  # a raw write: a handler may run in the middle of a print to stderr
            os.write(2, _ACKNOWLEDGED)


@contextmanager
def stop_on_signal() -> Iterator[StopRequest]:
    """A :class:`StopRequest` that the first SIGTERM or SIGINT sets, for the ``with`` block (a handler can
    only be installed from the main thread: elsewhere the request is never set and both act as before)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {each: signal.signal(each, request._handle) for each in STOP_SIGNALS}
    try:
        yield request
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)
