"""A running sandboxed process as the host sees it: stdin, capped stdout/stderr, a wall clock, a kill.

The host reads both pipes incrementally so a flood never fills its memory; past a cap or past the wall
clock the whole process group is killed (and with it the run's PID namespace).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass

from gym_bridge.sandbox.limits import SandboxLimits

__all__ = ["RunResult", "SandboxProcess", "feed"]

log = logging.getLogger("gym_bridge.sandbox")


@dataclass
class RunResult:
    """Outcome of :meth:`gym_bridge.sandbox.Sandbox.run`."""

    returncode: int | None
    """Exit status; negative for a signal (as in :mod:`subprocess`); None if it had to be killed."""
    stdout: bytes
    stderr_tail: str
    timed_out: bool = False
    output_exceeded: bool = False
    wall_s: float = 0.0


class SandboxProcess:
    """A running sandboxed process: write to its stdin, read its stdout by lines or all at once.

    Stdout and stderr are read incrementally and capped at ``limits.output_bytes`` each; past a cap, or
    past the wall clock, the whole process group is killed and the corresponding flag is set.
    """

    def __init__(self, proc: asyncio.subprocess.Process, limits: SandboxLimits) -> None:
        self._proc = proc
        self.limits = limits
        self.timed_out = False
        self.output_exceeded = False
        self.started = time.monotonic()
        self._stderr_tail: collections.deque[bytes] = collections.deque()
        self._stderr_kept = 0
        self._stderr_task = asyncio.ensure_future(self._drain_stderr())
        self._watchdog = asyncio.get_running_loop().call_later(limits.wall_s, self._on_wall_clock)

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    @property
    def stderr_tail(self) -> str:
        return b"".join(self._stderr_tail)[-self.limits.stderr_tail_bytes :].decode("utf-8", "replace")

    def _on_wall_clock(self) -> None:
        if self._proc.returncode is None:
            self.timed_out = True
            self.kill()

    def kill(self) -> None:
        """SIGKILL the process group (and with it the PID namespace)."""
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        with suppress(ProcessLookupError):
            self._proc.kill()

    async def _drain_stderr(self) -> None:
        """Keep stderr's tail; read to the end even past the cap (an unread pipe never reaches EOF)."""
        assert self._proc.stderr is not None
        total = 0
        keep = max(self.limits.stderr_tail_bytes, 1)
        while chunk := await self._proc.stderr.read(65536):
            total += len(chunk)
            if total > self.limits.output_bytes:
                if not self.output_exceeded:
                    self.output_exceeded = True
                    self.kill()
                continue
            self._stderr_tail.append(chunk)
            self._stderr_kept += len(chunk)
            while self._stderr_kept - len(self._stderr_tail[0]) >= keep:
                self._stderr_kept -= len(self._stderr_tail.popleft())

    async def _discard_stdout(self, timeout: float) -> bool:
        """Read and drop stdout until its end; False if it did not end within ``timeout``.

        Python 3.11's ``Process.wait()`` returns only once every pipe has reached EOF, and a pipe whose
        reader stopped (a full buffer pauses reading) never does: so drain before waiting.
        """
        assert self._proc.stdout is not None
        try:
            async with asyncio.timeout(timeout) if hasattr(asyncio, "timeout") else _deadline(timeout):
                while await self._proc.stdout.read(65536):
                    pass
        except (asyncio.TimeoutError, TimeoutError):
            return False
        return True

    async def send(self, data: bytes) -> bool:
        """Write to stdin; False when the process no longer reads (it exited or closed stdin)."""
        stdin = self._proc.stdin
        if stdin is None or stdin.is_closing():
            return False
        try:
            stdin.write(data)
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True

    def close_stdin(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.is_closing():
            self._proc.stdin.close()

    async def readline(self, timeout: float) -> bytes | None:
        """The next stdout line (without the newline); None at end of output.

        Raises :class:`TimeoutError` when no line comes within ``timeout`` seconds (the caller decides
        whether to kill); a line longer than the output cap kills the process and returns None.
        """
        assert self._proc.stdout is not None
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), timeout)
        except (ValueError, asyncio.LimitOverrunError):
            self.output_exceeded = True
            self.kill()
            return None
        except asyncio.TimeoutError:
            raise TimeoutError(f"no output line within {timeout:.1f} s") from None
        if not line:
            return None
        return line.rstrip(b"\n")

    async def read_all(self) -> bytes:
        """All of stdout up to the cap (the process is killed at the cap; the rest is read and dropped)."""
        assert self._proc.stdout is not None
        chunks: list[bytes] = []
        total = 0
        while chunk := await self._proc.stdout.read(65536):
            room = self.limits.output_bytes - total
            if len(chunk) > room:
                chunks.append(chunk[: max(room, 0)])
                self.output_exceeded = True
                self.kill()
                while await self._proc.stdout.read(65536):
                    pass
                break
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks)

    async def wait(self, timeout: float | None = None) -> int | None:
        """Exit status; kills the group first if it has not exited within ``timeout``."""
        try:
            return await asyncio.wait_for(self._proc.wait(), timeout)
        except asyncio.TimeoutError:
            self.kill()
        try:
            return await asyncio.wait_for(self._proc.wait(), 30.0)
        except asyncio.TimeoutError:  # never seen: SIGKILL cannot be ignored; do not hang the caller
            log.error("sandboxed process %d did not exit 30 s after SIGKILL", self._proc.pid)
            return None

    async def close(self, grace_s: float = 1.0) -> None:
        """Let the process finish (stdin closed) for up to ``grace_s``, then kill it; always reaps it."""
        self.close_stdin()
        if not await self._discard_stdout(grace_s):
            self.kill()
            await self._discard_stdout(10.0)
        await self.wait(5.0)
        self._watchdog.cancel()
        with suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(self._stderr_task, 1.0)
        if not self._stderr_task.done():
            self._stderr_task.cancel()
        transport = getattr(self._proc, "_transport", None)
        if transport is not None:  # release the pipes now rather than at garbage collection
            transport.close()


@asynccontextmanager
async def _deadline(timeout: float) -> AsyncIterator[None]:
    """``asyncio.timeout`` for Python 3.10."""
    task = asyncio.current_task()
    assert task is not None
    handle = asyncio.get_running_loop().call_later(timeout, task.cancel)
    try:
        yield
    except asyncio.CancelledError:
        raise asyncio.TimeoutError from None
    finally:
        handle.cancel()


async def feed(proc: SandboxProcess, data: bytes) -> None:
    """Write ``data`` to the process's stdin, then close it."""
    if data:
        await proc.send(data)
    proc.close_stdin()
