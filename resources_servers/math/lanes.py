"""The pool's scheduling: which waiting check gets the next free worker, and when workers are added.

Why its own module: :class:`~resources_servers.math.pool.VerifierPool` starts, watches and replaces
worker processes; this is the policy over them that keeps plain answers fast while hostile ones run
into their budget. It is a base class of the pool (:class:`LaneScheduling`) and works on the pool's
state: its workers, the idle queue and the queues of waiting checks.

Slow checks leave the lane: a check that has computed for ``slow_after_s`` (CPU seconds of its worker,
from /proc; wall-clock seconds where that cannot be read) -- a normal one takes milliseconds, a hostile
one will run into the budget -- no longer counts as one of the pool's ``size`` workers, and a fresh
worker takes its place; so does, at once, an answer that ran into the budget before. A plain answer must
not wait for that either (eight hostile answers on two cores take seconds of wall time to compute
``slow_after_s`` each, and a new worker takes a while to start on a loaded machine), so:

- a check that arrives while ``size`` lane checks have each computed ``stuck_after_s`` CPU seconds, or
  while any check is slow (an attack, most likely), gets a worker of its own, before the checks that
  arrived with the stuck ones (a burst of hostile answers arrives together and waits its turn for
  the lane; what comes ``stuck_after_s`` or more after it does not);
- meanwhile one idle worker is kept spare for the next check to arrive.

At most ``size + slow_workers`` workers run at once; workers beyond ``size`` are stopped when they finish
a check and none waits. CPU seconds, not waiting time, mark a check slow: on a machine so loaded that
every check crawls, more processes would only make every check slower. (Slow workers are not reniced:
there a niced check that would finish starves into a timeout.) A check's budget and verdict are the same
wherever it runs.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING

from resources_servers.math.worker_process import Worker, cpu_seconds

if TYPE_CHECKING:
    from resources_servers.math.pool import PoolStats

POLL_S = 0.05
"""How often a lane check's CPU seconds are read while checks wait for a worker or until it has computed
``stuck_after_s`` (see :meth:`LaneScheduling._on_slow`)."""


class LaneScheduling:
    """Dispatch of waiting checks to workers, and growing and trimming the pool around slow checks.

    What it reads and keeps is set up by the pool; what it starts and stops goes through the pool's
    ``_respawn``, ``_stop``, ``_in_background`` and ``_broken_message``.
    """

    size: int
    slow_after_s: float
    slow_workers: int
    stuck_after_s: float
    stats: PoolStats
    _loop: asyncio.AbstractEventLoop | None
    _workers: set[Worker]
    _slow: set[Worker]
    _spawning: int
    _idle: deque[Worker] | None
    _waiters: deque[asyncio.Future[Worker]]
    _late_waiters: deque[asyncio.Future[Worker]]
    _suspect_waiters: deque[asyncio.Future[Worker]]
    _arrived: dict[asyncio.Future[Worker], float]
    _closed: bool
    _broken: bool

    @property
    def _waiting(self) -> int:
        """Checks waiting for a worker."""
        return len(self._waiters) + len(self._late_waiters) + len(self._suspect_waiters)

    def _queue_for(self, suspect: bool) -> deque[asyncio.Future[Worker]]:
        """Where a check that finds no idle worker waits (see :meth:`_next_waiter` for the order)."""
        if suspect:
            return self._suspect_waiters
        if self.slow_workers and (self._slow or self._lane_stuck()):
            return self._late_waiters
        return self._waiters

    def _lane_checks(self) -> list[Worker]:
        """Workers running a check of the lane (sent, not slow)."""
        return [w for w in self._workers if w.alive and w.busy and not w.slow and w.sent_at is not None]

    def _lane_busy(self) -> int:
        """Workers handed to a check that is not slow (sent or about to be)."""
        return sum(w.alive and w.busy and not w.slow for w in self._workers)

    def _lane_stuck(self) -> bool:
        """Whether ``size`` checks of the lane have each computed ``stuck_after_s`` CPU seconds already.
        A plain check takes milliseconds: a check that arrives now would wait for ones that may well run
        into the budget, unless it gets a worker of its own. CPU seconds, not wall time: on a loaded
        machine every check takes long, and more processes would only slow them all."""
        running = self._lane_checks()
        if len(running) < self.size:
            return False
        stuck = 0
        for w in running:
            cpu = cpu_seconds(w.pid) if w.cpu_at_start is not None else None
            if cpu is None or w.cpu_at_start is None:  # wall seconds where /proc cannot be read
                stuck += time.monotonic() - (w.sent_at or 0.0) >= self.stuck_after_s
            else:
                stuck += cpu - w.cpu_at_start >= self.stuck_after_s
        return stuck >= self.size

    def _promote(self) -> None:
        """The lane is stuck: checks waiting that arrived ``stuck_after_s`` or more after the newest of
        the lane's checks are not part of its burst (a burst reaches the pool within milliseconds), so
        they join the checks that get a worker of their own."""
        lane = self._lane_checks()
        if not lane or not self._waiters:
            return
        after = max(w.arrived_at for w in lane) + self.stuck_after_s
        late = [waiter for waiter in self._waiters if self._arrived.get(waiter, 0.0) >= after]
        for waiter in late:
            self._waiters.remove(waiter)
            self._late_waiters.append(waiter)

    async def _acquire(self, suspect: bool) -> Worker:
        """An idle worker, or the next one freed or started (see :meth:`_next_waiter` for the order)."""
        assert self._idle is not None and self._loop is not None
        arrived = time.monotonic()
        while True:
            while self._idle:
                worker = self._idle.popleft()
                if worker.alive:
                    worker.busy, worker.arrived_at = True, arrived
                    return worker
            if self._broken:
                raise RuntimeError(self._broken_message())
            waiter: asyncio.Future[Worker] = self._loop.create_future()
            queue = self._queue_for(suspect)
            queue.append(waiter)
            self._arrived[waiter] = arrived
            if queue is self._late_waiters:
                self._grow()
            try:
                worker = await waiter
            except asyncio.CancelledError:
                for waiters in (self._waiters, self._late_waiters, self._suspect_waiters):
                    if waiter in waiters:  # (it may have been promoted meanwhile)
                        waiters.remove(waiter)
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    self._release(waiter.result())  # handed over just now: pass it on
                raise
            finally:
                self._arrived.pop(waiter, None)
            if worker.alive:
                worker.arrived_at = arrived
                return worker

    def _release(self, w: Worker) -> None:
        """A worker is free: hand it (or another idle one) to a waiting check, or keep it idle."""
        assert self._idle is not None
        w.busy = False
        self._idle.append(w)
        self._dispatch()

    def _dispatch(self) -> None:
        """Hand idle workers to waiting checks while :meth:`_next_waiter` names one."""
        assert self._idle is not None
        while self._idle:
            if not self._idle[0].alive:
                self._idle.popleft()
                continue
            waiter = self._next_waiter()
            if waiter is None:
                return
            w = self._idle.popleft()
            w.busy = True
            waiter.set_result(w)

    def _next_waiter(self) -> asyncio.Future[Worker] | None:
        """The waiting check that gets the next free worker (taken from its queue), or None.

        Checks that came after the lane got stuck come first (oldest first): each gets a worker of its
        own. The others get a worker while the lane has a place for it (fewer than ``size`` checks
        running that are not slow), but not the spare (see :meth:`_grow`); while a check is slow (an
        attack, most likely), the newest first: a burst of answers that will time out arrives together,
        and one sent after it should not wait for the whole burst to be dispatched. Checks whose answer
        ran into the budget before come last."""
        assert self._idle is not None
        lane_open = not self.slow_workers or (
            self._lane_busy() < self.size
            and not (sum(w.alive for w in self._idle) <= 1 and (self._slow or self._lane_stuck()))  # spare
        )
        for waiters in (self._late_waiters, self._waiters, self._suspect_waiters):
            if waiters is not self._late_waiters and not lane_open:
                return None
            while waiters:
                waiter = waiters.pop() if self._slow and waiters is self._waiters else waiters.popleft()
                if not waiter.done():
                    return waiter
        return None

    def _trim(self) -> None:
        """Stop idle workers beyond ``size`` (not counting slow ones) while no check waits: the ones
        started to replace a slow check that has ended, or to serve a burst; one idle worker stays
        spare while a check is slow or the lane is stuck."""
        assert self._idle is not None
        while self._waiting == 0 and len(self._workers) - len(self._slow) > self.size and self._idle:
            if len(self._idle) == 1 and self.slow_workers and (self._slow or self._lane_stuck()):
                return  # the spare (see _grow)
            w = self._idle.popleft()
            if w.alive:
                self._stop(w)

    def _on_slow(self, w: Worker, task_id: int) -> None:
        """A lane check has run a while: once it has computed ``slow_after_s``, take its worker out of
        the lane (see the module doc). Until then, while the lane is stuck, start the spare before the
        next check comes and give the checks that came after the burst a worker of their own."""
        if w.task_id != task_id or not w.alive or w.slow:
            return
        assert self._loop is not None
        cpu = cpu_seconds(w.pid)
        if cpu is not None and w.cpu_at_start is not None:
            used = cpu - w.cpu_at_start
        else:  # wall-clock seconds where /proc cannot be read
            used = time.monotonic() - (w.sent_at or 0.0)
        if used >= self.slow_after_s and len(self._slow) < self.slow_workers:
            self._leave_lane(w)
            return
        if self._lane_stuck():
            self._promote()
            self._grow()
            self._dispatch()
        left = self.slow_after_s - used
        if left <= 0 and not self._waiters:  # the slow lane is full and nothing waits: stop looking
            return
        # Look often while checks wait, or until this one could count as stuck (for the spare).
        often = self._waiters or left <= 0 or used < self.stuck_after_s
        delay = min(left, POLL_S) if often else left
        w.slow_timer = self._loop.call_later(max(delay, 0.02), self._on_slow, w, task_id)

    def _leave_lane(self, w: Worker) -> None:
        """Count a worker's check as slow: it no longer holds one of the ``size`` lane places."""
        w.slow = True
        self._slow.add(w)
        self.stats.slow_checks += 1
        self._grow()
        self._dispatch()  # a lane place is free, and every waiting check may now have a worker

    def _grow(self) -> None:
        """Start workers (at most ``size + slow_workers`` in all) so that ``size`` are free of slow
        checks, and, while the lane is stuck or a check slow, so that every check that came after the
        burst has one coming and one more is spare for the next check to arrive.

        Why: a lane worker is freed by a hostile check only once that check has computed
        ``slow_after_s``, which takes several times longer in wall time with eight of them sharing two
        cores; a check that waits for that waits behind the attack. Starting a worker forks a warm one
        in milliseconds, but on a loaded machine that takes a while: the spare is ready when the next
        plain answer arrives. The burst itself gets no extra workers: more processes computing answers
        that will time out would only leave less CPU to the checks that will not."""
        if self._closed or not self.slow_workers:  # no slow lane: every check waits its turn
            return
        assert self._idle is not None
        coming = self._spawning + sum(w.alive for w in self._idle)
        wanted = self.size - (len(self._workers) - len(self._slow) + self._spawning)
        if self._slow or self._late_waiters or self._lane_stuck():
            wanted = max(wanted, len(self._late_waiters) + 1 - coming)
        room = self.size + self.slow_workers - len(self._workers) - self._spawning
        for _ in range(min(wanted, room)):
            self.stats.lane_spawns += 1
            self._spawning += 1  # counted now: the next _grow (same loop turn) must see it
            self._in_background(self._respawn(counted=True))
