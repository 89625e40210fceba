"""Scorer worker processes for the reasoning_gym server: isolated, time-limited, retired when tainted.

Why: reasoning-gym's scorers may evaluate the answer (``eval``, ``sympy.parse_expr``), may run for
minutes on a hostile one (``9**9**9**9``), and ran in the server's own process. Here every check runs
in a worker process (:mod:`resources_servers.reasoning_gym.worker`) that holds no server state, runs
under its own unprivileged uid when the server is root, and is killed at the check's deadline.

The pattern is the math server's pool (:mod:`resources_servers.math.pool`): workers forked from a fork
server (the pool's own, :mod:`resources_servers.reasoning_gym.forkserver`) that preloaded reasoning-gym,
so a replacement is ready in tens of milliseconds and nothing is forked from the multi-threaded
server; a pipe per worker watched by the event loop, and a deadline per
check after which the worker is SIGKILLed, the check answered ``timeout`` and a replacement started.
Different from it: a worker whose check compiled or evaluated answer text (an ``eval``-ing or SymPy
family) is retired after answering, so whatever that answer might have done to the process can never
touch a later check; the families that only compare strings keep their warm worker.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gym_bridge.sandbox.slots import default_uid_base
from gym_bridge.serving.pipe_worker import PipeWorker, discard_start
from resources_servers.reasoning_gym.forkserver import ScorerProcess, set_preload

logger = logging.getLogger(__name__)

WORKER_MODULE = "resources_servers.reasoning_gym.worker"
STARTUP_TIMEOUT_S = 60.0
"""A worker that has not reported ready after this long is a failed start."""
WAIT_FOR_WORKER_S = 120.0
"""A check that finds no worker within this long (none could be started) is answered with an error."""
MAX_REPLY_BYTES = 64 * 1024
"""Longest message a worker may send; a longer one is treated as a crash."""


def _read(conn: Any) -> Any:
    """A worker's message: JSON, never pickle (a compromised worker must not run code in the server)."""
    return json.loads(conn.recv_bytes(MAX_REPLY_BYTES))


def _parse_result(result: Any) -> ScoreOutcome:
    """A worker's verdict, checked: anything malformed is a crash, not a reward."""
    if not isinstance(result, dict) or result.get("status") not in ("ok", "error"):
        raise ValueError("malformed verdict")
    score = result.get("score", 0.0)
    if result["status"] == "ok" and not (isinstance(score, int | float) and math.isfinite(score) and 0 <= score <= 1):
        raise ValueError(f"score out of range: {score!r}")
    detail, refused = result.get("detail"), result.get("refused")
    return ScoreOutcome(
        "ok" if result["status"] == "ok" else "error",
        score=float(score) if result["status"] == "ok" else 0.0,
        detail=str(detail)[:300] if detail is not None else None,
        refused=str(refused)[:300] if refused is not None else None,
    )


class ReasoningGymConfig(BaseModel):
    """The reasoning_gym server's settings (all about its scorer workers)."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(10.0, gt=0)
    """Longest a scorer may take on one answer; past it the reward is 0 (``scorer_timeout``) and the
    worker is killed and replaced."""
    pool_size: int = Field(0, ge=0, le=64)
    """Scorer worker processes; 0 means one per CPU core available to the server."""
    worker_memory_mb: int | None = Field(2048, ge=256)
    """Address-space limit of each worker (a runaway answer fails instead of swapping); None: none."""
    no_partial_credit: list[str] = Field(default_factory=list)
    """Families (``"*"``: every family) whose reward is 1 only for a full score and 0 for any partial credit
    (``score`` still says what the family's scorer gave). Why: some partial credit pays answers that did no
    work, e.g. game_of_life's share of right cells gives the all-dead grid ~0.95 on sparse boards. Default
    none: the package's (and NeMo Gym's) rewards."""

    @field_validator("no_partial_credit")
    @classmethod
    def _known_families(cls, families: list[str]) -> list[str]:
        from reasoning_gym.factory import DATASETS

        unknown = [f for f in families if f != "*" and f not in DATASETS]
        if unknown:
            raise ValueError(f"unknown reasoning-gym families {unknown} (a family name, or '*' for all)")
        return families

    def all_or_nothing(self, family: str) -> bool:
        """Whether ``family``'s partial credit is dropped (:attr:`no_partial_credit`)."""
        return "*" in self.no_partial_credit or family in self.no_partial_credit

    def workers(self) -> int:
        if self.pool_size:
            return self.pool_size
        try:
            return max(1, min(64, len(os.sched_getaffinity(0))))
        except AttributeError:  # not Linux
            return max(1, min(64, os.cpu_count() or 1))


@dataclass
class ScoreOutcome:
    """What the pool says about one check."""

    status: Literal["ok", "error", "timeout", "crashed", "unavailable"]
    score: float = 0.0
    detail: str | None = None
    """Why, for anything but ``ok``: the scorer's exception, the deadline, the worker's exit."""
    refused: str | None = None
    """What a guard refused to run during the check (the scorer then scored the answer as unparsable)."""


@dataclass
class PoolStats:
    """Counters since start: ``retired`` workers evaluated answer text, ``killed`` ran past a deadline."""

    checks: int = 0
    timeouts: int = 0
    crashes: int = 0
    retired: int = 0
    started: int = 0
    start_failures: int = 0


@dataclass(eq=False)
class _Worker(PipeWorker[ScoreOutcome]):
    slot: int = field(kw_only=True)
    """Which of the pool's places it holds (its replacement takes the same one, and its uid)."""


def _worker_entry(conn: Any, uid: int | None, memory_mb: int | None) -> None:
    from resources_servers.reasoning_gym.worker import worker_main

    worker_main(conn, uid, memory_mb)


def _preload() -> list[str]:
    """What the fork server imports once: the worker, and what the server's main module imports. Each
    child re-runs the main module as ``__mp_main__``; with its imports already loaded that takes
    microseconds instead of the ~0.5 s that importing ``gym_bridge.cli`` costs, on every replacement of
    a retired worker. (Python 3.11's own ``"__main__"`` preload never reaches the fork server.)"""
    names = [WORKER_MODULE, __name__]  # this module: each child unpickles _worker_entry from it
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and not spec.name.endswith("__main__"):
        names.append(spec.name)  # a main run with -m (python -m gym_bridge.cli serve ...)
    elif getattr(main, "__file__", None):
        names += _imported_by(main.__file__)  # a script (the gym-bridge console script imports gym_bridge.cli)
    return names


def _imported_by(path: str) -> list[str]:
    """The modules a script imports at its top level (what a child re-running it would import)."""
    import ast

    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (OSError, SyntaxError, ValueError):
        return []
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


def _spawn(slot: int, uid: int | None, memory_mb: int | None, abandon: threading.Event) -> _Worker:
    """Start one worker and wait for its ready message (blocking: run it in a thread)."""
    set_preload(_preload())
    parent_conn, child_conn = mp.Pipe(duplex=True)
    process = ScorerProcess(target=_worker_entry, args=(child_conn, uid, memory_mb), name="rg-scorer", daemon=True)
    process.start()
    child_conn.close()
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not parent_conn.poll(0.02):
            if abandon.is_set():
                raise RuntimeError("the scorer pool closed while a worker was starting")
            if not process.is_alive():
                raise RuntimeError(f"the scorer worker exited while starting (exit code {process.exitcode})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scorer worker was not ready within {STARTUP_TIMEOUT_S:.0f} s")
        kind, pid = _read(parent_conn)
        if kind != "ready" or not isinstance(pid, int):
            raise RuntimeError(f"the scorer worker sent {kind!r} instead of 'ready'")
    except BaseException:
        discard_start(process, parent_conn)
        raise
    return _Worker(slot=slot, process=process, conn=parent_conn, pid=pid)


def _stop(process: Any) -> None:
    process.join(1.0)
    if process.is_alive():
        process.kill()
        process.join(5.0)


class ScorerPool:
    """``size`` scorer workers; a check never runs longer than ``timeout_s``.

    Slot ``i``'s worker runs as uid ``uid_base + i`` when the server is root (at most one live worker per
    slot, so no two workers ever share a uid).
    """

    def __init__(
        self, size: int, timeout_s: float, memory_mb: int | None = None, uid_base: int | None = None
    ) -> None:
        if not 1 <= size <= 64:
            raise ValueError(f"pool size must be between 1 and 64, got {size}")
        self.size = size
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.uid_base = uid_base if uid_base is not None else default_uid_base()
        self.stats = PoolStats()
        self._workers: dict[int, _Worker] = {}
        self._idle: asyncio.Queue[_Worker] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task_ids = itertools.count()
        self._background: set[asyncio.Task[Any]] = set()
        self._abandon = threading.Event()
        self._closed = False
        self.start_error: str | None = None

    def uid(self, slot: int) -> int | None:
        """The uid slot ``slot``'s worker runs as (None: the server is not root and keeps its own)."""
        return self.uid_base + slot if os.geteuid() == 0 else None

    def describe(self) -> dict[str, Any]:
        """For ``/health``."""
        return {
            "size": self.size,
            "live_workers": len(self._workers),
            "pids": self.pids,
            "timeout_s": self.timeout_s,
            "uids": [self.uid(0), self.uid(self.size - 1)] if os.geteuid() == 0 else None,
            "start_error": self.start_error,
            **asdict(self.stats),
        }

    @property
    def pids(self) -> list[int]:
        return sorted(w.pid for w in self._workers.values())

    async def start(self) -> None:
        """Start the workers in the background; checks wait for the first one ready."""
        self._loop = asyncio.get_running_loop()
        self._idle = asyncio.Queue()
        for slot in range(self.size):
            self._in_background(self._fill(slot))

    def _in_background(self, coro: Any) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _fill(self, slot: int) -> None:
        """Start slot ``slot``'s worker, retrying with backoff until one comes up or the pool closes."""
        assert self._loop is not None and self._idle is not None
        delay = 0.1
        while not self._closed:
            try:
                worker = await self._loop.run_in_executor(
                    None, _spawn, slot, self.uid(slot), self.memory_mb, self._abandon
                )
            except Exception as e:
                if self._closed:
                    return
                self.stats.start_failures += 1
                self.start_error = f"{type(e).__name__}: {e}"
                logger.warning("could not start a reasoning_gym scorer worker (%s)", self.start_error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            if self._closed:
                worker.conn.close()
                await asyncio.to_thread(_stop, worker.process)
                return
            self.stats.started += 1
            self._workers[slot] = worker
            self._loop.add_reader(worker.conn.fileno(), self._on_readable, worker)
            self._idle.put_nowait(worker)
            return

    async def score(self, family: str, answer: str, entry: dict[str, Any]) -> ScoreOutcome:
        """The family's scorer on ``answer`` in a worker (waiting for an idle one)."""
        if self._idle is None or self._loop is None or self._closed:
            raise RuntimeError("the scorer pool is not running")
        try:
            worker = await asyncio.wait_for(self._next_idle(), WAIT_FOR_WORKER_S)
        except asyncio.TimeoutError:
            why = f"no scorer worker could be started within {WAIT_FOR_WORKER_S:.0f} s ({self.start_error})"
            return ScoreOutcome("unavailable", detail=why)
        self.stats.checks += 1
        task_id = next(self._task_ids)
        future: asyncio.Future[ScoreOutcome] = self._loop.create_future()
        worker.task_id, worker.future = task_id, future
        worker.deadline = self._loop.call_later(self.timeout_s, self._on_deadline, worker, task_id)
        try:
            worker.conn.send_bytes(json.dumps([task_id, family, answer, entry]).encode())
        except (OSError, ValueError) as e:
            self._retire(worker, ScoreOutcome("crashed", detail=f"the scorer worker was unreachable: {e}"))
        # Shielded: a cancelled request must not leave a worker busy with nobody to collect its answer.
        return await asyncio.shield(future)

    async def _next_idle(self) -> _Worker:
        assert self._idle is not None
        while True:
            worker = await self._idle.get()
            if worker.alive:
                return worker

    # ------------------------------------------------------------------ event-loop callbacks

    def _on_readable(self, w: _Worker) -> None:
        try:
            task_id, result = _read(w.conn)
            outcome = _parse_result(result)
        except (EOFError, OSError, ValueError, TypeError) as e:
            self.stats.crashes += 1
            why = "it exited" if isinstance(e, EOFError) else f"{type(e).__name__}: {e}"[:200]
            detail = f"the scorer worker failed during the check ({why}); it was replaced"
            self._retire(w, ScoreOutcome("crashed", detail=detail))
            return
        if task_id != w.task_id or w.future is None:
            self._retire(w, ScoreOutcome("crashed", detail="the scorer worker answered out of turn"))
            return
        w.answer(outcome)
        if result.get("evaluated"):
            self.stats.retired += 1
            self._retire(w, None)  # answer text was evaluated in it: never reused
        else:
            assert self._idle is not None
            self._idle.put_nowait(w)

    def _on_deadline(self, w: _Worker, task_id: int) -> None:
        if w.task_id != task_id or not w.alive:
            return
        self.stats.timeouts += 1
        detail = f"the scorer ran past its {self.timeout_s:g} s budget; its worker was killed and replaced"
        self._retire(w, ScoreOutcome("timeout", detail=detail))

    # ------------------------------------------------------------------ worker lifecycle

    def _retire(self, w: _Worker, outcome: ScoreOutcome | None) -> None:
        """Kill a worker, answer its pending check with ``outcome``, and start its slot's replacement."""
        assert self._loop is not None
        if not w.detach(self._loop, outcome):
            return
        if self._workers.get(w.slot) is w:
            del self._workers[w.slot]
        w.kill()
        if not self._closed:
            self._in_background(self._replace(w))

    async def _replace(self, dead: _Worker) -> None:
        await asyncio.to_thread(dead.process.join, 5.0)  # reaped before its uid is used again
        if not self._closed and dead.process.exitcode not in (None, -signal.SIGKILL):  # SIGKILL: retired by us
            logger.warning("reasoning_gym scorer worker %d exited with %s", dead.pid, dead.process.exitcode)
        await self._fill(dead.slot)

    async def close(self) -> None:
        """Stop every worker and fail checks still waiting."""
        self._closed = True
        self._abandon.set()
        for task in list(self._background):
            task.cancel()
        workers = list(self._workers.values())
        for w in workers:
            assert self._loop is not None
            w.detach(self._loop, ScoreOutcome("unavailable", detail="the scorer pool is shutting down"))
            try:
                w.conn.send_bytes(b"null")
            except (OSError, ValueError):
                pass
            w.conn.close()
        await asyncio.gather(*(asyncio.to_thread(_stop, w.process) for w in workers))
        self._workers.clear()
