"""Many deadlines of one length on one event loop, for the price of one timer.

Why: a server puts a deadline on every request (its headers must arrive within ``HEADER_TIMEOUT_S``, its
body within ``body_timeout_s``), and nearly all of them are met within microseconds. A timer per deadline
(``loop.call_later`` or ``asyncio.timeout``, then its cancellation) cost about 10 us each under uvloop
(a timer handle, a heap entry, a cancellation), three per request: a fifth of a small request's CPU.
Here all deadlines share one length, so they fall due in the order they were set: a dict in insertion
order is the queue, setting and clearing one are a dict insert and delete, and one timer, armed for the
oldest deadline still set, serves them all (under steady traffic it wakes about once per length).
:class:`TaskDeadlines` puts such deadlines on awaits (``asyncio.timeout``'s job): a request body's arrival
on the server, an HTTP request's answer on the client, where ``asyncio.timeout`` (a timer set and cancelled,
five Python frames) cost ~40k instructions a request (~120k of a no-op rollout's 3.1 M).
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

__all__ = ["Deadlines", "TaskDeadlines", "task_deadlines", "within"]

T = TypeVar("T")


class Deadlines:
    """Calls ``expire(key)`` for each key still set ``seconds`` after :meth:`set` (never earlier).

    Bound to one event loop (``loop``): set and clear keys from that loop's thread only.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float, expire: Callable[[Any], None]) -> None:
        self.loop, self.seconds, self.expire = loop, seconds, expire
        self._due: dict[Hashable, float] = {}
        """key -> when it falls due, oldest first (every key gets the same length, so insertion order is due order)."""
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._due)

    def set(self, key: Hashable) -> None:
        """Start ``key``'s deadline (a key already set keeps its earlier one)."""
        if key in self._due:
            return
        due = self.loop.time() + self.seconds
        self._due[key] = due
        if self._timer is None:
            self._timer = self.loop.call_at(due, self._fire)

    def clear(self, key: Hashable) -> None:
        """Stop ``key``'s deadline, if set (the one timer stays armed: it finds nothing due and moves on)."""
        self._due.pop(key, None)

    def _fire(self) -> None:
        self._timer = None
        now = self.loop.time()
        expired = []
        for key, due in self._due.items():
            if due > now:
                break
            expired.append(key)
        for key in expired:
            del self._due[key]
        if self._due:
            self._timer = self.loop.call_at(next(iter(self._due.values())), self._fire)
        for key in expired:
            try:
                self.expire(key)
            except Exception as exc:  # one failing callback must not leave the others' deadlines unserved
                self.loop.call_exception_handler({"message": f"deadline callback failed for {key!r}", "exception": exc})


class TaskDeadlines(Deadlines):
    """Deadlines on awaits: :meth:`within` ends an await that outlasts ``seconds`` in ``TimeoutError``,
    as ``asyncio.timeout`` does, without a timer of its own."""

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        super().__init__(loop, seconds, _cancel)

    async def within(self, awaitable: Awaitable[T]) -> T:
        """``awaitable``'s result, or ``TimeoutError`` once ``seconds`` have passed since this call (the
        awaiting task is cancelled, and the cancellation becomes ``TimeoutError`` when it was this deadline's
        and no other is pending, as ``asyncio.timeout`` decides)."""
        task = asyncio.current_task(self.loop)
        if task is None:
            raise RuntimeError("TaskDeadlines.within must be awaited inside a task")
        watch = _Watch(task)
        due = self._due[watch] = self.loop.time() + self.seconds  # (set() of a new key, without the call)
        if self._timer is None:
            self._timer = self.loop.call_at(due, self._fire)
        try:
            return await awaitable
        except asyncio.CancelledError:
            if watch.expired and task.uncancel() <= watch.cancelling:
                raise TimeoutError from None
            raise
        finally:
            self._due.pop(watch, None)  # (clear())


class _Watch:
    """One await's key in a :class:`TaskDeadlines`: when it expires, the awaiting task is cancelled."""

    __slots__ = ("cancelling", "expired", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task, self.cancelling, self.expired = task, task.cancelling(), False


def _cancel(watch: _Watch) -> None:
    watch.expired = True
    watch.task.cancel()


_SHARED_LENGTHS = 16
"""Most lengths :func:`task_deadlines` keeps per loop (past that, the one made first is let go: its
deadlines still expire, it just is not handed out again)."""
_shared = threading.local()


def task_deadlines(seconds: float) -> TaskDeadlines:
    """The running loop's :class:`TaskDeadlines` of ``seconds``, shared by every await of that length on it
    (the server's body reads, the client's requests), so one timer serves them all."""
    loop = asyncio.get_running_loop()
    cache = getattr(_shared, "cache", None)
    if cache is None or cache[0] is not loop:
        cache = _shared.cache = (loop, {})
    by_length = cache[1]
    found = by_length.get(seconds)
    if found is None:
        if len(by_length) >= _SHARED_LENGTHS:
            del by_length[next(iter(by_length))]
        found = by_length[seconds] = TaskDeadlines(loop, seconds)
    return found


def within(seconds: float, awaitable: Awaitable[T]) -> Awaitable[T]:
    """``awaitable`` with a deadline for the whole of it (``TimeoutError`` when it passes); awaits of one
    length on a loop share its one timer (:func:`task_deadlines`). Deadlines nest: an outer one that
    expires surfaces as the outer one's ``TimeoutError``, never an inner one's."""
    if sys.version_info >= (3, 11):
        return task_deadlines(seconds).within(awaitable)
    return asyncio.wait_for(awaitable, seconds)  # pragma: no cover - Python 3.10
