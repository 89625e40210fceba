"""How a resumable command (collect, reverify) ends on a refused run or on Ctrl-C."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer


@contextmanager
def resumable_exit(console: Any, output: Path, kept: str) -> Iterator[None]:
    """A :class:`~gym_bridge.collect.CollectError` exits 2 with its message; a file that cannot be written
    (:class:`~gym_bridge.records.jsonl.WriteFailed`: a full disk, a file-size limit) exits 1 naming it;
    Ctrl-C exits 130; the last two say that the ``kept`` records are in ``output`` and that ``--resume``
    finishes the run."""
    from rich.markup import escape

    from gym_bridge.collect import CollectError
    from gym_bridge.records.jsonl import WriteFailed

    try:
        yield
    except CollectError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        raise typer.Exit(2) from None
    except WriteFailed as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        console.print(f"the {kept} written before it are in {output}; free the space, then rerun with --resume "
                      "to do the rest", highlight=False)  # fmt: skip
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        console.print(f"interrupted: {kept} are in {output}; rerun with --resume to do the rest", markup=False)
        raise typer.Exit(130) from None
