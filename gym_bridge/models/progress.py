"""Say what a long wait is doing: model builds and loads that take a minute or two on CPU.

On a terminal a rich progress bar (or a spinner with the elapsed time) on stderr; elsewhere (logs,
pipes, CI) plain lines on stderr, a few per wait, so nothing looks hung and stdout stays clean.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from gym_bridge.console import console

__all__ = ["counted", "waiting"]


def _console() -> Console:
    return console(stderr=True, highlight=False)  # piped: lines whole, not cut at 80 columns


@contextmanager
def waiting(what: str) -> Iterator[None]:
    """``what`` with a spinner and the elapsed time while the block runs, then how long it took."""
    console = _console()
    started = time.monotonic()
    if console.is_terminal:
        columns = (SpinnerColumn(), TextColumn(what), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            bar.add_task(what, total=None)
            yield
    else:
        console.print(f"{what} ...")
        yield
    console.print(f"{what}: done in {time.monotonic() - started:.0f} s")


@contextmanager
def counted(what: str, total: int, unit: str = "steps") -> Iterator[Callable[[int, float], None]]:
    """A progress bar over ``total`` ``unit``; yields ``update(done, loss)``. Off a terminal, a line at
    every tenth of the way."""
    console = _console()
    started = time.monotonic()
    if console.is_terminal:
        columns = (
            TextColumn(f"[bold]{what}"),
            BarColumn(),
            TextColumn(f"{{task.completed}}/{{task.total}} {unit}  loss {{task.fields[loss]:.3f}}"),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task(what, total=total, loss=float("nan"))
            yield lambda done, loss: bar.update(task, completed=done, loss=loss)
    else:
        console.print(f"{what}: {total} {unit} ...")
        every = max(1, total // 10)

        def line(done: int, loss: float) -> None:
            if done % every == 0 or done == total:
                console.print(
                    f"  {what}: {done}/{total} {unit}, loss {loss:.3f}, {time.monotonic() - started:.0f} s"
                )

        yield line
    console.print(f"{what}: done in {time.monotonic() - started:.0f} s")
