"""A warm pool of verifier processes with a hard per-check deadline, awaited from asyncio.

Why a pool: SymPy can run for minutes on a hostile answer (``9^{9^{9^9}}``), and Python cannot stop a
thread, only a process. NeMo Gym forks one process per check, which caps it at about a dozen checks a
second on two cores; here processes are started once with math-verify imported and warmed, and reused.

How a check runs: an idle worker gets ``(expected, candidate, budget)`` over a pipe; the event loop
watches the pipe with ``add_reader`` (no thread per check). The worker interrupts itself when the budget
runs out (see :mod:`resources_servers.math.worker`); if it has not answered ``kill_grace_s`` later, the
parent kills it with SIGKILL, answers ``timeout`` and starts a replacement. Other checks keep flowing
through the remaining workers meanwhile.

Workers are processes forked from a warm fork server (:mod:`resources_servers.math.worker_process`); which
waiting check gets the next free worker, and when the pool grows past ``size`` because checks are slow,
is :mod:`resources_servers.math.lanes`.

Workers start when the first check needs one, in the background: warming the fork server (importing
SymPy and math-verify, one check) takes a second or more of CPU, while many runs never need a worker (plain
numbers are compared in the server process), so the server answers from its first request and a run
of plain answers never pays for the pool. Checks wait for the first warm worker. The server process
itself never imports math-verify.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Literal

from resources_servers.math.lanes import LaneScheduling
from resources_servers.math.worker_process import (
    StartAbandoned,
    Worker,
    WorkerStartTimeout,
    cpu_seconds,
    discard_spawned,
    spawn_worker,
    stop_process,
)

logger = logging.getLogger(__name__)

CACHE_CHARS = 32 * 1024 * 1024
"""Characters of cached keys (expected + candidate) at most: the cache's memory stays bounded whatever
the answers' length."""


@dataclass
class CheckOutcome:
    """What the pool says about one check."""

    status: Literal["ok", "timeout", "error"]
    correct: bool = False
    extracted: str | None = None
    failure_kind: str | None = None
    """For ``ok``: ``unparsable_answer`` / ``unparsable_expected_answer`` when math-verify parsed nothing."""
    detail: str | None = None


_Key = tuple[str, str, bool, bool]
"""A check's identity: expected answer, candidate, whether the candidate is a whole response, strict."""

SUSPECTS = 10_000
"""Checks remembered as having run into the budget (their keys, least recently seen out)."""


@dataclass
class PoolStats:
    """Counters since start. ``checks`` reached a worker; ``cache_hits`` and ``coalesced`` (joined an
    identical check in flight) did not. ``killed`` counts timeouts that needed SIGKILL. ``slow_checks``
    left the lane (ran past ``slow_after_s``); ``lane_spawns`` are workers started to take their place
    or to serve checks waiting meanwhile (also counted in ``restarts``)."""

    checks: int = 0
    cache_hits: int = 0
    coalesced: int = 0
    timeouts: int = 0
    killed: int = 0
    errors: int = 0
    restarts: int = 0
    start_failures: int = 0
    slow_checks: int = 0
    lane_spawns: int = 0


class VerifierPool(LaneScheduling):
    """``size`` warm math-verify processes; a check never runs longer than the budget plus grace.

    Verdicts are cached by ``(expected, candidate, whole_text, strict)`` (``cache_size`` entries and
    ``cache_chars`` characters of keys, least recently used out): a GRPO group's samples often give the
    same answer, and identical checks in flight are run once.
    """

    def __init__(
        self,
        size: int,
        timeout_s: float,
        kill_grace_s: float = 1.0,
        memory_mb: int | None = None,
        cache_size: int = 0,
        start_method: str = "forkserver",
        cache_chars: int = CACHE_CHARS,
        slow_after_s: float = 0.25,
        slow_workers: int = 0,
        stuck_after_s: float = 0.05,
    ) -> None:
        if size < 1:
            raise ValueError(f"pool size must be at least 1, got {size}")
        self.size = size
        self.timeout_s = timeout_s
        self.kill_grace_s = kill_grace_s
        self.memory_mb = memory_mb
        self.start_method = start_method
        self.cache_size = cache_size
        self.cache_chars = cache_chars
        self.slow_after_s = slow_after_s
        self.slow_workers = slow_workers
        self.stuck_after_s = stuck_after_s
        self.stats = PoolStats()
        self._cache: OrderedDict[_Key, CheckOutcome] = OrderedDict()
        self._cached_chars = 0
        self._running: dict[_Key, asyncio.Task[CheckOutcome]] = {}
        self._workers: set[Worker] = set()
        self._slow: set[Worker] = set()
        """Live workers whose check left the lane."""
        self._spawning = 0
        """Worker starts in progress."""
        self._idle: deque[Worker] | None = None
        self._waiters: deque[asyncio.Future[Worker]] = deque()
        """Checks waiting for a worker, oldest first."""
        self._late_waiters: deque[asyncio.Future[Worker]] = deque()
        """Checks that came after the lane got stuck (see :meth:`_lane_stuck` and :meth:`_promote`): they
        get a worker of their own, before the others."""
        self._arrived: dict[asyncio.Future[Worker], float] = {}
        """When each waiting check arrived (monotonic seconds)."""
        self._suspect_waiters: deque[asyncio.Future[Worker]] = deque()
        """Checks waiting for a worker whose answer ran into the budget before: served after the others."""
        self._suspects: OrderedDict[_Key, None] = OrderedDict()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task_ids = itertools.count()
        self._background: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._abandon = threading.Event()
        """Set on close: worker starts still waiting for their worker give up (see :func:`spawn_worker`)."""
        self._starter = ThreadPoolExecutor(size + slow_workers + 1, thread_name_prefix="math-verifier-start")
        """Threads that wait for starting workers: their own, so that a burst of starts during an attack
        neither waits for asyncio's few default threads nor holds them from the server's other work."""
        self._launched = False
        """Whether the workers were asked to start (by the first check)."""
        self._starting = 0
        """Workers of the initial start still warming up."""
        self._started: asyncio.Event | None = None
        self._start_error: str | None = None
        """Why the last worker start failed."""
        self._start_failures_other_than_timeouts = 0
        """Failed starts that were not :class:`WorkerStartTimeout` (a crash, a bad start method: they repeat)."""
        self._broken = False
        """No worker of the initial start came up: checks fail with :attr:`_start_error`."""

    def describe(self) -> dict[str, Any]:
        """Size, live workers, whether they were started and are still warming up, counters; for ``/health``."""
        return {
            "size": self.size,
            "live_workers": len(self.pids),
            "slow_running": len(self._slow),
            "started": self._launched,
            "starting": self._starting > 0,
            **asdict(self.stats),
        }

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        return sorted(w.pid for w in self._workers if w.alive)

    async def start(self) -> None:
        """Make the pool ready to take checks; its workers start (in the background, in parallel)
        with the first check, or with :meth:`wait_started`."""
        self._loop = asyncio.get_running_loop()
        self._idle = deque()
        self._started = asyncio.Event()

    def _launch(self) -> None:
        """Start the workers (once)."""
        if self._launched:
            return
        self._launched = True
        self._starting = self.size
        for _ in range(self.size):
            self._in_background(self._start_one())

    async def wait_started(self) -> None:
        """Start the workers if no check has yet, and wait until they are up; raise if none could be."""
        if self._started is None:
            raise RuntimeError("the verifier pool was not started")
        self._launch()
        await self._started.wait()
        if self._broken:
            raise RuntimeError(self._broken_message())

    async def _start_one(self) -> None:
        """One worker of the initial start. When none of them comes up, the pool is broken, unless
        every start only timed out: a busy machine, so they are retried and checks wait for them."""
        worker = await self._spawn()
        if worker is not None:
            self._adopt(worker)
        self._starting -= 1
        if self._starting:
            return
        assert self._started is not None and self._idle is not None
        if not self._closed:
            if not self._workers and self._start_failures_other_than_timeouts:
                self._broken = True
                logger.error("%s", self._broken_message())
                for waiters in (self._waiters, self._late_waiters, self._suspect_waiters):
                    for waiter in waiters:  # they get the reason
                        if not waiter.done():
                            waiter.set_exception(RuntimeError(self._broken_message()))
                    waiters.clear()
            else:
                for _ in range(self.size - len(self._workers)):  # the failed ones: retried with backoff
                    self._in_background(self._respawn())
                if not self._workers:  # started once the first retry comes up (_respawn)
                    logger.warning("verifier workers are slow to start (a busy machine?): still trying")
                    return
        self._started.set()

    async def _spawn(self, counted: bool = False) -> Worker | None:
        """A warm worker, or None when it could not be started (or the pool closed meanwhile).
        ``counted``: the caller already added this start to ``_spawning``."""
        assert self._loop is not None
        if not counted:
            self._spawning += 1
        spawning = self._loop.run_in_executor(
            self._starter, spawn_worker, self.start_method, self.memory_mb, self._abandon
        )
        try:
            worker = await asyncio.shield(spawning)
        except asyncio.CancelledError:  # the pool is closing: a worker that still comes up is stopped
            spawning.add_done_callback(discard_spawned)
            raise
        except StartAbandoned:
            return None
        except Exception as e:
            self.stats.start_failures += 1
            self._start_failures_other_than_timeouts += not isinstance(e, WorkerStartTimeout)
            self._start_error = f"{type(e).__name__}: {e}"
            logger.warning("could not start a verifier worker (%s)", self._start_error)
            return None
        finally:
            self._spawning -= 1
        if self._closed:
            worker.conn.close()  # the worker exits on end-of-file
            await asyncio.to_thread(stop_process, worker.process)
            return None
        return worker

    def _broken_message(self) -> str:
        return f"the math verifier pool could not start any worker ({self._start_error})"

    def _in_background(self, coro: Any) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def check(
        self, expected: str, candidate: str, whole_text: bool = False, strict: bool = False
    ) -> CheckOutcome:
        """math-verify's verdict on a pair: from the cache, from an identical check already running, or
        from the next idle worker (waiting for one when all are busy). ``whole_text``: ``candidate`` is a
        whole response for math-verify to extract from; ``strict``: an answer it cannot read on its own
        is wrong (see :func:`resources_servers.math.worker.check`)."""
        if self._idle is None or self._loop is None or self._closed:
            raise RuntimeError("the verifier pool is not running")
        self._launch()
        key = (expected, candidate, whole_text, strict)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self.stats.cache_hits += 1
            return cached
        running = self._running.get(key)
        if running is None:
            running = self._loop.create_task(self._run(expected, candidate, whole_text, strict))
            self._running[key] = running
            running.add_done_callback(lambda task: self._finished(key, task))
        else:
            self.stats.coalesced += 1
        # Shielded: a cancelled request must not cancel a check that others may be waiting for.
        return await asyncio.shield(running)

    def _finished(self, key: _Key, task: asyncio.Task[CheckOutcome]) -> None:
        self._running.pop(key, None)
        if task.cancelled() or task.exception() is not None or self.cache_size <= 0:
            return
        outcome = task.result()
        size = len(key[0]) + len(key[1])
        # Timeouts and errors may not repeat (load, a dead worker); a key over a tenth of the budget
        # would push out many ordinary verdicts for one that is unlikely to recur.
        if outcome.status == "ok" and size <= self.cache_chars // 10 and key not in self._cache:
            self._cache[key] = outcome
            self._cached_chars += size
            while len(self._cache) > self.cache_size or self._cached_chars > self.cache_chars:
                (old_expected, old_candidate, *_), _ = self._cache.popitem(last=False)
                self._cached_chars -= len(old_expected) + len(old_candidate)

    async def _run(self, expected: str, candidate: str, whole_text: bool, strict: bool) -> CheckOutcome:
        assert self._idle is not None and self._loop is not None
        key = (expected, candidate, whole_text, strict)
        suspect = self.slow_workers > 0 and key in self._suspects
        worker = await self._acquire(suspect)
        self.stats.checks += 1
        task_id = next(self._task_ids)
        future: asyncio.Future[CheckOutcome] = self._loop.create_future()
        worker.task_id, worker.future, worker.sent_at = task_id, future, time.monotonic()
        worker.deadline = self._loop.call_later(
            self.timeout_s + self.kill_grace_s, self._on_deadline, worker, task_id
        )
        if suspect and len(self._slow) < self.slow_workers:  # it ran into the budget before
            self._leave_lane(worker)
        elif self.slow_workers:
            worker.cpu_at_start = cpu_seconds(worker.pid)
            first_look = min(self.slow_after_s, self.stuck_after_s)
            worker.slow_timer = self._loop.call_later(first_look, self._on_slow, worker, task_id)
            if self._slow or len(self._workers) > self.size:  # an attack or a stuck lane: see _grow
                self._grow()  # (the spare it may have taken)
        try:
            worker.conn.send((task_id, expected, candidate, self.timeout_s, whole_text, strict))
        except (OSError, ValueError) as e:
            self._retire(worker, CheckOutcome("error", detail=f"verifier worker unreachable: {e}"))
        # The worker goes back to the idle queue when its answer arrives (or is replaced at the deadline),
        # whether or not anyone still waits for this future.
        outcome = await asyncio.shield(future)
        if self.slow_workers and outcome.status == "timeout" and len(key[0]) + len(key[1]) <= 10_000:
            self._suspects[key] = None
            self._suspects.move_to_end(key)
            if len(self._suspects) > SUSPECTS:
                self._suspects.popitem(last=False)
        return outcome

    async def close(self) -> None:
        """Stop every worker (politely, then by SIGKILL) and fail checks still waiting."""
        self._closed = True
        self._abandon.set()
        if self._started is not None:
            self._started.set()
        for task in [*self._background, *self._running.values()]:
            task.cancel()
        workers = list(self._workers)
        for w in workers:
            self._detach(w, CheckOutcome("error", detail="the verifier pool is shutting down"))
            _hang_up(w)
        await asyncio.gather(*(asyncio.to_thread(stop_process, w.process) for w in workers))
        self._workers.clear()
        self._starter.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ event-loop callbacks

    def _adopt(self, w: Worker) -> None:
        assert self._loop is not None and self._idle is not None
        self._workers.add(w)
        self._loop.add_reader(w.conn.fileno(), self._on_readable, w)
        self._release(w)
        self._trim()

    def _on_readable(self, w: Worker) -> None:
        try:
            task_id, result = w.conn.recv()
        except (EOFError, OSError, ValueError):
            code = w.process.exitcode
            self.stats.errors += 1
            self._retire(
                w, CheckOutcome("error", detail=f"verifier worker exited unexpectedly (exit code {code})")
            )
            return
        if task_id != w.task_id or w.future is None:
            return  # an answer nobody waits for any more (cannot happen unless the protocol breaks)
        w.answer(self._outcome(result))
        assert self._idle is not None
        w.slow = False
        self._slow.discard(w)
        self._release(w)
        self._trim()

    def _outcome(self, result: dict[str, Any]) -> CheckOutcome:
        status = result["status"]
        if status == "timeout":
            self.stats.timeouts += 1
            return CheckOutcome(
                "timeout",
                detail=f"the math check ran past its {self.timeout_s:g} s budget and was interrupted",
            )
        if status == "error":
            self.stats.errors += 1
            return CheckOutcome("error", detail=result.get("detail"))
        return CheckOutcome(
            "ok",
            correct=result["correct"],
            extracted=result["extracted"],
            failure_kind=result["failure_kind"],
        )

    def _on_deadline(self, w: Worker, task_id: int) -> None:
        if w.task_id != task_id or not w.alive:
            return
        self.stats.timeouts += 1
        self.stats.killed += 1
        budget = self.timeout_s + self.kill_grace_s
        detail = f"the math check did not return within {budget:g} s; its worker was killed and replaced"
        self._retire(w, CheckOutcome("timeout", detail=detail))

    # ------------------------------------------------------------------ worker lifecycle

    def _detach(self, w: Worker, outcome: CheckOutcome) -> None:
        """Stop watching a worker and answer its pending check with ``outcome``."""
        assert self._loop is not None
        if not w.detach(self._loop, outcome):
            return
        self._workers.discard(w)
        self._slow.discard(w)

    def _stop(self, w: Worker) -> None:
        """Stop an idle worker (it exits on the end of its pipe)."""
        self._detach(w, CheckOutcome("error", detail="the worker was stopped"))
        _hang_up(w)
        self._in_background(asyncio.to_thread(stop_process, w.process))

    def _retire(self, w: Worker, outcome: CheckOutcome) -> None:
        """Kill a stuck or broken worker, answer its check, and start a replacement in the background."""
        self._detach(w, outcome)
        w.kill()
        if not self._closed:
            self._trim()
            self._in_background(self._replace(w))

    async def _replace(self, dead: Worker) -> None:
        await asyncio.to_thread(dead.process.join, 5.0)  # reap it
        if len(self._workers) - len(self._slow) + self._spawning < self.size:  # else replaced already
            await self._respawn()

    async def _respawn(self, counted: bool = False) -> None:
        """Start a worker, retrying with backoff until one comes up or the pool closes. ``counted``:
        the caller already added the first start to ``_spawning``."""
        delay = 0.1
        try:
            while not self._closed:
                first, counted = counted, False
                fresh = await self._spawn(first)
                if fresh is not None:
                    self.stats.restarts += 1
                    self._adopt(fresh)
                    if self._started is not None:
                        self._started.set()  # a start that only timed out has now come up
                    return
                if not self._closed:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 10.0)
        finally:
            if counted:  # closed before the first start
                self._spawning -= 1


def _hang_up(w: Worker) -> None:
    """Tell an idle worker to exit (``None`` down its pipe, which it reads as the end) and close the pipe."""
    try:
        w.conn.send(None)
    except (OSError, ValueError):
        pass
    w.conn.close()
