"""Many deadlines of one length on one event loop, for the price of one timer.

Why: a server puts a deadline on every request (its headers must arrive within ``HEADER_TIMEOUT_S``, its
body within ``body_timeout_s``), and nearly all of them are met within microseconds. A timer per deadline
(``loop.call_later`` or ``asyncio.timeout``, then its cancellation) cost about 10 us each under uvloop
(a timer handle, a heap entry, a cancellation), three per request: a fifth of a small request's CPU.
Here all deadlines share one length, so they fall due in the order they were set: a dict in insertion
order is the queue, setting and clearing one are a dict insert and delete, and one timer, armed for the
oldest deadline still set, serves them all (under steady traffic it wakes about once per length).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["Deadlines"]


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
