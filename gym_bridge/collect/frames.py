"""Messages between ``collect``'s parent and its worker processes: pickled values, each framed by its length,
over a local socket pair, gathered into one frame per turn of the event loop.

Why batched: a frame a rollout costs a system call and a wake-up on each side; thousands of rollouts a
second arrive together, so each side queues what it has to send and writes it all once the loop has run
the callbacks that were ready (:class:`Outbox`). Pickle, not JSON: the values are the run's own (an
:class:`~gym_bridge.rollout.agent.AgentConfig`, task rows, encoded rollouts), from a process of this same
install, and pickling a string is a copy.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any

__all__ = ["Outbox", "read_frame", "write_frame"]

_HEAD = struct.Struct("!I")


def write_frame(writer: asyncio.StreamWriter, value: Any) -> None:
    """Queue ``value`` on ``writer`` as one frame (the transport sends it as soon as the socket takes it)."""
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(_HEAD.pack(len(data)) + data)


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next frame's value; None at the end of the stream (the other side closed or died: a reset
    connection too, which a process killed with unread data on its socket leaves)."""
    try:
        head = await reader.readexactly(_HEAD.size)
        return pickle.loads(await reader.readexactly(_HEAD.unpack(head)[0]))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


class Outbox:
    """Items for the other side, sent as one list per turn of the event loop."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.items: list[Any] = []

    def put(self, item: Any) -> None:
        """Send ``item`` with the others put before the loop's next turn."""
        if not self.items:
            asyncio.get_running_loop().call_soon(self.flush)
        self.items.append(item)

    def flush(self) -> None:
        if self.items and not self.writer.is_closing():
            items, self.items = self.items, []
            write_frame(self.writer, items)
