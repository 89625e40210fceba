"""The asyncio event loop every gym-bridge loop thread and runner uses, and how a command runs one."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

try:  # uvloop comes with ``uvicorn[standard]``; plain asyncio otherwise
    import uvloop
except ImportError:  # pragma: no cover - depends on the install
    uvloop = None

__all__ = ["new_event_loop", "run_interruptible"]

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed (cheaper per request), else asyncio's."""
    return uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()


def run_interruptible(main: Coroutine[Any, Any, T], stop: threading.Event | None = None) -> T:
    """Run ``main`` on a new loop to the end; Ctrl-C always ends it in ``KeyboardInterrupt``.

    Why not ``asyncio.run``: it turns Ctrl-C into a cancellation of the main task and raises
    ``KeyboardInterrupt`` only if that task ends cancelled; a cancellation swallowed on the way (a
    client library's timeout or retry catching it) let an interrupted ``collect`` run to the end and
    exit 0. Here the first Ctrl-C sets ``stop`` (workers check it before taking more work) and cancels
    every task of the loop, and the run raises ``KeyboardInterrupt`` whatever ``main`` did; a second
    Ctrl-C raises at once. Off the main thread (no signals there) it is a plain run.
    """
    loop = new_event_loop()
    interrupts = 0

    def on_sigint(signum: int, frame: Any) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts > 1:
            raise KeyboardInterrupt
        if stop is not None:
            stop.set()
        loop.call_soon_threadsafe(_cancel_all, loop)

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, on_sigint) if in_main else None
    asyncio.set_event_loop(loop)
    try:
        try:
            result = loop.run_until_complete(main)
        except asyncio.CancelledError:
            if interrupts:
                raise KeyboardInterrupt from None
            raise
        if interrupts:
            raise KeyboardInterrupt
        return result
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)
        try:
            loop.run_until_complete(_drain())
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()


async def _drain() -> None:
    """Cancel what is still running on this loop and let it finish (as ``asyncio.run`` does)."""
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)
