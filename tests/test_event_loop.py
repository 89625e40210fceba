"""Ctrl-C during a command's event loop (collect, reverify) always ends in KeyboardInterrupt."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

from gym_bridge.serving.event_loop import run_interruptible


@pytest.fixture(autouse=True)
def default_ctrl_c() -> object:
    """Python's own Ctrl-C handler for each test: a process started in the background by a
    non-interactive shell inherits SIGINT ignored, and then neither asyncio's runner nor ours sees it."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


async def stubborn(stop: threading.Event | None, seen: list[str]) -> str:
    """Interrupts itself, then swallows the cancellation (as a client library's retry may) and goes on."""
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(200):
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            seen.append("cancel swallowed")
        if stop is not None and stop.is_set():
            seen.append("stopped")
            break
    return "ran to the end"


def test_asyncio_runner_lets_a_swallowed_cancel_finish_the_run() -> None:
    """Why run_interruptible exists: asyncio's own runner returns normally here, so collect exited 0."""
    seen: list[str] = []
    with asyncio.Runner() as runner:
        assert runner.run(stubborn(None, seen)) == "ran to the end"
    assert seen == ["cancel swallowed"]


def test_ctrl_c_sets_stop_and_raises_even_when_the_cancel_is_swallowed() -> None:
    stop, seen = threading.Event(), []
    with pytest.raises(KeyboardInterrupt):
        run_interruptible(stubborn(stop, seen), stop)
    assert stop.is_set() and seen == ["cancel swallowed", "stopped"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored


def test_a_run_without_ctrl_c_returns_its_result_and_leaves_no_task() -> None:
    async def main() -> int:
        asyncio.get_running_loop().create_task(asyncio.sleep(60))  # left running: cancelled at the end
        return 7

    assert run_interruptible(main()) == 7
