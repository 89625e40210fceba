"""A scorer worker process: reasoning-gym's scorers, run without the server's privileges or memory.

The worker is forked from the pool's fork server, which imported this module (and with it reasoning-gym)
once (see :mod:`resources_servers.reasoning_gym.pool`); then, before it reads any answer, it:

* when started as root, drops to its own unprivileged uid and gid (one per pool slot, no supplementary
  groups) and may then have only itself as a process (``RLIMIT_NPROC`` 1: no fork, no thread); the
  interpreter's directories that only root can enter stay reachable through directory descriptors
  the fork server opened when it imported this module (``/proc/self/fd/N``), so lazy imports work;
* points its standard streams at ``/dev/null``, sets ``no_new_privs`` and makes itself non-dumpable
  (no other process of its uid can trace it or read its memory), limits its address space and core
  size, forbids file growth (``RLIMIT_FSIZE`` 0) and moves to ``/``;
* installs the guards of :mod:`resources_servers.reasoning_gym.guards`.

It then answers ``[task_id, family, answer, entry]`` messages with ``[task_id, result]`` (JSON both
ways: the server never unpickles what a worker sends) until its pipe closes; ``result["evaluated"]``
tells the pool that answer text was compiled or evaluated, and the pool then retires this process
rather than give it another answer.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import resource
import signal
import sys
import warnings
from functools import cache
from typing import Any

import reasoning_gym  # imported in the fork server (this module is its preload): workers start warm
import sympy  # noqa: F401
from sympy.parsing import sympy_parser  # noqa: F401

from resources_servers.reasoning_gym import guards
from resources_servers.reasoning_gym.corrections import CORRECTED

_PR_SET_DUMPABLE = 4
_PR_SET_NO_NEW_PRIVS = 38


@cache
def _scorer(family: str) -> Any:
    """The family's scorer: the package's own, or its correction (:mod:`resources_servers.reasoning_gym.corrections`)."""
    return CORRECTED.get(family) or reasoning_gym.get_score_answer_fn(family)


def _searchable_by_others(path: str) -> bool:
    probe = os.path.realpath(path)
    while True:
        try:
            if not os.stat(probe).st_mode & 0o001:
                return False
        except OSError:
            return False
        if probe == "/":
            return True
        probe = os.path.dirname(probe)


def _keep_imports_reachable() -> list[int]:
    """Point import paths under directories other users cannot enter at descriptors opened now."""
    aliases: list[tuple[str, str]] = []
    fds: list[int] = []
    for entry in list(sys.path):
        if not entry or not os.path.isdir(entry) or _searchable_by_others(entry):
            continue
        fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)
        fds.append(fd)
        for form in {entry, os.path.realpath(entry)}:  # modules may name either
            aliases.append((form.rstrip(os.sep), f"/proc/self/fd/{fd}"))
    aliases.sort(key=lambda pair: -len(pair[0]))

    def alias(path: str) -> str:
        for prefix, replacement in aliases:
            if path == prefix or path.startswith(prefix + os.sep):
                return replacement + path[len(prefix) :]
        return path

    if aliases:
        sys.path[:] = [alias(p) if p else p for p in sys.path]
        for module in list(sys.modules.values()):
            search = getattr(module, "__path__", None)
            if isinstance(search, list):
                search[:] = [alias(p) if isinstance(p, str) else p for p in search]
        sys.path_importer_cache.clear()
    return fds


@cache
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    libc = _libc()
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def drop_privileges(uid: int | None, memory_mb: int | None) -> None:
    """Everything the module docstring lists, in that order; raises if a step that matters fails."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the server; it shuts workers down
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # nothing a scorer prints reaches the server's terminal or log
        os.dup2(devnull, fd)
    os.close(devnull)
    if os.geteuid() == 0:
        if uid is None:
            raise RuntimeError("a scorer worker started as root needs a uid to drop to")
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
        if os.getuid() != uid or os.geteuid() != uid:
            raise RuntimeError("the scorer worker could not drop root")
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    _prctl(_PR_SET_DUMPABLE, 0)
    if memory_mb:
        limit = memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.chdir("/")


def score(family: str, answer: str, entry: dict[str, Any]) -> dict[str, Any]:
    """One check under the armed guards; failures become results, never exceptions."""
    guards.state.reset(armed=True)
    try:
        value = _scorer(family)(answer=answer, entry=entry)
        reward = float(value)
        if not math.isfinite(reward):
            raise ValueError(f"the scorer returned {reward!r}")
        result: dict[str, Any] = {"status": "ok", "score": reward}
    except MemoryError:
        result = {"status": "error", "detail": "MemoryError: out of memory (worker memory limit)"}
    except Exception as e:  # the scorer's own bug (or a refused answer it did not catch)
        result = {"status": "error", "detail": f"{type(e).__name__}: {e}"[:300]}
    finally:
        guards.state.armed = False
    result["evaluated"] = guards.state.evaluated
    result["refused"] = guards.state.refused[0][:300] if guards.state.refused else None
    return result


def worker_main(conn: Any, uid: int | None, memory_mb: int | None) -> None:
    """Serve checks over ``conn`` until it closes; sends ``("ready", pid)`` first."""
    drop_privileges(uid, memory_mb)
    guards.install()
    conn.send_bytes(json.dumps(["ready", os.getpid()]).encode())
    while True:
        try:
            message = json.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        if message is None:
            return
        task_id, family, answer, entry = message
        conn.send_bytes(json.dumps([task_id, score(family, answer, entry)]).encode())


# In the fork server (this module is its preload), once: its children inherit all four. Each child
# re-runs the server's main module, which the fork server preloaded (see pool._preload), so runpy warns.
warnings.filterwarnings("ignore", r"'.*' found in sys\.modules after import of package", RuntimeWarning)
_libc()
guards.guard_reasoning_gym()
if os.geteuid() == 0:
    _keep_imports_reachable()
