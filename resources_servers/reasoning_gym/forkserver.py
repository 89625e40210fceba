"""A fork server of the scorer pool's own, apart from multiprocessing's process-wide one.

Why: multiprocessing keeps one fork server per process, and only the preload list set before it starts
counts. The math server's pool uses that one too; in a process that serves both (a test session,
in-process training with several environments) whichever started first would decide, and the other
pool's workers would import their libraries at every start (seconds, for reasoning-gym), while the
workers of both would inherit the other's import-time set-up. Here the pool gets CPython's own
:class:`multiprocessing.forkserver.ForkServer`, started separately with its own preload, and a Process
class whose start asks that server instead of the shared one (the launch below is CPython's
``popen_forkserver.Popen._launch`` with the server swapped).
"""

from __future__ import annotations

import io
import os
from multiprocessing import context, forkserver, popen_forkserver, reduction, spawn, util
from typing import Any

__all__ = ["ScorerProcess", "set_preload"]

_SERVER = forkserver.ForkServer()


def set_preload(modules: list[str]) -> None:
    """Modules the fork server imports once when it starts (later calls change nothing once it runs)."""
    _SERVER.set_forkserver_preload(modules)


class _Popen(popen_forkserver.Popen):
    def _launch(self, process_obj: Any) -> None:
        prep_data = spawn.get_preparation_data(process_obj._name)
        buf = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            context.set_spawning_popen(None)
        self.sentinel, w = _SERVER.connect_to_new_process(self._fds)
        parent_w = os.dup(w)  # the child's sentinel of its parent, as in CPython
        self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class ScorerProcess(context.ForkServerProcess):
    """A ``multiprocessing`` process forked by the pool's own fork server."""

    @staticmethod
    def _Popen(process_obj: Any) -> _Popen:
        return _Popen(process_obj)
