"""How a resumable command (collect, reverify) ends on a refused run or on Ctrl-C."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer


@contextmanager
def resumable_exit(console: Any, output: Path, kept: str) -> Iterator[None]:
    """A :class:`~gym_bridge.collect.CollectError` exits 2 with its message; Ctrl-C exits 130 saying
    that the ``kept`` records are in ``output`` and that ``--resume`` finishes the run."""
    from gym_bridge.collect import CollectError

    try:
        yield
    except CollectError as e:
        console.print(f"[bold red]error:[/] {e}")
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        console.print(f"interrupted: {kept} are in {output}; rerun with --resume to do the rest")
        raise typer.Exit(130) from None
