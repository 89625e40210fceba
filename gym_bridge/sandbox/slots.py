"""Concurrency slots of a :class:`gym_bridge.sandbox.Sandbox`: at most ``n`` runs at once, each with a slot
index that picks its uid when the server runs as root (so no two concurrent runs share a process count).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

__all__ = ["Slots", "default_uid_base"]


class Slots:
    """At most ``n`` runs at once across every event loop and thread of the process, first come first
    served; each run holds a slot index (which picks its uid when the server runs as root, so no two
    concurrent runs share a process-count limit)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._free = collections.deque(range(n))
        self._waiters: collections.deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[int]]] = (
            collections.deque()
        )
        self._lock = threading.Lock()

    async def _take(self) -> int:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free:
                return self._free.popleft()
            waiter: asyncio.Future[int] = loop.create_future()
            self._waiters.append((loop, waiter))
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed a slot just before the cancellation
                self._give(waiter.result())
            else:
                with self._lock, suppress(ValueError):
                    self._waiters.remove((loop, waiter))  # still queued (if not, _deliver passes it on)
            raise

    def _give(self, slot: int) -> None:
        with self._lock:
            while self._waiters:
                loop, waiter = self._waiters.popleft()
                try:
                    loop.call_soon_threadsafe(self._deliver, waiter, slot)
                    return
                except RuntimeError:  # that loop is closed
                    continue
            self._free.append(slot)

    def _deliver(self, waiter: asyncio.Future[int], slot: int) -> None:
        if waiter.done():  # cancelled meanwhile: pass the slot on
            self._give(slot)
        else:
            waiter.set_result(slot)

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[int]:
        slot = await self._take()
        try:
            yield slot
        finally:
            self._give(slot)


_instance_counter = itertools.count()


def default_uid_base() -> int:
    """Uids nobody else uses, distinct per server process and Sandbox instance (64 slots each)."""
    return 10_000_000 + ((os.getpid() % 1_000_000) * 16 + next(_instance_counter) % 16) * 64
