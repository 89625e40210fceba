"""A verifier worker process seen from its pool: behind a pipe the event loop watches, running one check
at a time under a deadline.

Why its own module: the math and reasoning_gym servers each keep a pool of such workers
(:mod:`resources_servers.math.pool`, :mod:`resources_servers.reasoning_gym.pool`); how a check is
ended (its timers off, its future answered once) and how a worker is let go (its pipe off the loop, its
pending check answered, its process killed) is the same in both, and written here once. When to start,
retire and replace workers stays with each pool. It imports only light standard modules at run time: the
math server's fork server preloads the module that subclasses it.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:  # types only: this module stays light to import (see the docstring)
    import asyncio

__all__ = ["PipeWorker", "discard_start"]

Outcome = TypeVar("Outcome")


@dataclass(eq=False)
class PipeWorker(Generic[Outcome]):
    """A live worker process, its end of the pipe, and the check it is running."""

    process: Any
    conn: Any
    pid: int
    alive: bool = True
    task_id: int | None = None
    future: asyncio.Future[Outcome] | None = None
    deadline: asyncio.TimerHandle | None = None

    def clear_task(self) -> None:
        """Forget the current check (its deadline cancelled); the worker is free for another."""
        if self.deadline is not None:
            self.deadline.cancel()
        self.task_id, self.future, self.deadline = None, None, None

    def answer(self, outcome: Outcome | None) -> None:
        """End the current check with ``outcome`` (None: leave its future unanswered)."""
        future = self.future
        self.clear_task()
        if future is not None and not future.done() and outcome is not None:
            future.set_result(outcome)

    def detach(self, loop: asyncio.AbstractEventLoop, outcome: Outcome | None) -> bool:
        """Stop watching this worker and answer its pending check with ``outcome``. False when it was
        detached already (nothing done)."""
        if not self.alive:
            return False
        self.alive = False
        try:
            loop.remove_reader(self.conn.fileno())
        except (OSError, ValueError):
            pass
        self.answer(outcome)
        return True

    def kill(self) -> None:
        """SIGKILL the process (one that is gone already is fine) and close this end of its pipe."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.conn.close()


def discard_start(process: Any, conn: Any) -> None:
    """Undo a worker start that failed or was abandoned: the process killed and reaped (5 s at most), this
    end of its pipe closed."""
    process.kill()
    process.join(5)
    conn.close()
