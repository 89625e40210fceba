"""The asyncio event loop every gym-bridge loop thread and runner uses."""

from __future__ import annotations

import asyncio

try:  # uvloop comes with ``uvicorn[standard]``; plain asyncio otherwise
    import uvloop
except ImportError:  # pragma: no cover - depends on the install
    uvloop = None

__all__ = ["new_event_loop"]


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed (cheaper per request), else asyncio's."""
    return uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
