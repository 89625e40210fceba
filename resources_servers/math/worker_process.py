"""One verifier worker process, seen from the server: started warm from a fork server, stopped, measured.

Why its own module: how a worker process comes to life (the fork server, the warm-up handshake, the
start deadline), how it is stopped, and how its CPU seconds are read are the process mechanics under
the pool's scheduling (:mod:`resources_servers.math.pool`, :mod:`resources_servers.math.lanes`); what runs
inside the worker is :mod:`resources_servers.math.worker`.

Workers are started with the ``forkserver`` method, with the worker module preloaded in the fork
server: a replacement forks from an already-warm process in milliseconds, and no process is forked
from the multi-threaded server. As with any non-``fork`` start method, a script that starts the pool
must guard its entry point with ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.spawn as mp_spawn
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gym_bridge.serving.pipe_worker import PipeWorker, discard_start

if TYPE_CHECKING:
    import asyncio

    from resources_servers.math.pool import CheckOutcome  # noqa: F401 (Worker's base names it as a string)

STARTUP_TIMEOUT_S = 60.0
"""A worker that is not warm after this long (import and one warm-up check) is a failed start."""
WORKER_MODULE = "resources_servers.math.worker"
"""Imported in the workers (preloaded once in the fork server), never in the server process."""


@dataclass(eq=False)
class Worker(PipeWorker["CheckOutcome"]):
    """A live worker process, its end of the pipe, and the check it is running (the pool's view of it),
    with what the math pool's lanes schedule by."""

    slow_timer: asyncio.TimerHandle | None = None
    busy: bool = False
    """Handed to a check (from then until its answer arrives)."""
    sent_at: float | None = None
    """When its check was sent (monotonic seconds)."""
    arrived_at: float = 0.0
    """When its check arrived at the pool (monotonic seconds; it may have waited since)."""
    cpu_at_start: float | None = None
    """The worker's CPU seconds when its check was sent (for the slow test)."""
    slow: bool = False
    """Its check outlived ``slow_after_s``: it does not count as one of the pool's ``size``."""

    def clear_task(self) -> None:
        """Forget the current check: its deadline and slow timer cancelled."""
        super().clear_task()
        if self.slow_timer is not None:
            self.slow_timer.cancel()
        self.slow_timer, self.sent_at = None, None


_WITHOUT_MAIN = threading.local()
"""Set while this module starts a worker: see :func:`_preparation_without_main`."""
_original_preparation_data = mp_spawn.get_preparation_data


def _preparation_without_main(name: str) -> dict[str, Any]:
    """multiprocessing's preparation data for a new process, without the parent's main module when this
    module starts a worker. A forkserver child otherwise imports the parent's ``__main__`` again before
    it runs anything (for ``gym-bridge serve`` the whole CLI: seconds of a busy machine's CPU per worker),
    which a worker never needs: everything it runs is importable by name."""
    data = _original_preparation_data(name)
    if getattr(_WITHOUT_MAIN, "on", False):
        data.pop("init_main_from_name", None)
        data.pop("init_main_from_path", None)
    return data


mp_spawn.get_preparation_data = _preparation_without_main


def _worker_entry(conn: Any, memory_mb: int | None) -> None:
    """A worker process's main (it imports math-verify there, from the fork server's warm copy)."""
    from resources_servers.math.worker import worker_main

    worker_main(conn, memory_mb)


class StartAbandoned(Exception):
    """The pool closed while a worker was warming up (the worker is killed)."""


class WorkerStartTimeout(RuntimeError):
    """A worker was not warm within :data:`STARTUP_TIMEOUT_S`: a slow (busy) machine, not a broken
    one, so the pool keeps trying instead of giving up (see :meth:`VerifierPool._start_one`)."""


def spawn_worker(
    start_method: str, memory_mb: int | None, abandon: threading.Event | None = None
) -> Worker:
    """Start one worker process and wait until it reports warm (blocking: run it in a thread).

    Setting ``abandon`` stops the wait (and the worker) within a few milliseconds.
    """
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        # This module too: a new worker unpickles _worker_entry from it, and importing it there cost each
        # start ~50 ms of CPU (when it lived in the pool module, asyncio and all), ten times the rest of the start.
        ctx.set_forkserver_preload([WORKER_MODULE, __name__])
    parent_conn, child_conn = ctx.Pipe(duplex=True)
    process = ctx.Process(
        target=_worker_entry, args=(child_conn, memory_mb), name="math-verifier", daemon=True
    )
    _WITHOUT_MAIN.on = True
    try:
        process.start()
    finally:
        _WITHOUT_MAIN.on = False
    child_conn.close()
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:  # the deadline first: a start now takes milliseconds, less than one poll
            if abandon is not None and abandon.is_set():
                raise StartAbandoned
            if time.monotonic() >= deadline:
                raise WorkerStartTimeout(
                    f"verifier worker did not get ready within {STARTUP_TIMEOUT_S:.0f} s"
                )
            if parent_conn.poll(0.02):
                break
        kind, pid = parent_conn.recv()
        if kind != "ready":
            raise RuntimeError(f"verifier worker sent {kind!r} instead of 'ready'")
    except BaseException:
        discard_start(process, parent_conn)
        raise
    return Worker(process=process, conn=parent_conn, pid=pid)


def discard_spawned(spawning: asyncio.Future[Worker]) -> None:
    """Stop a worker whose start finished after the pool closed (its end of the pipe closes, it exits)."""
    if spawning.cancelled() or spawning.exception() is not None:
        return
    worker = spawning.result()
    worker.conn.close()
    worker.process.kill()


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (Linux /proc); None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def stop_process(process: Any) -> None:
    process.join(1.0)
    if process.is_alive():
        process.kill()
        process.join(5.0)
