"""How a resumable command (collect, reverify) ends on a refused run or on Ctrl-C."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

_NO_ROOM = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS})
"""Write errors of a file that has no room (or no longer takes writes): the run's side files and spool
meet them too, not only the lines of :class:`~gym_bridge.records.jsonl.JsonlWriter`."""


@contextmanager
def resumable_exit(console: Any, output: Path, kept: str) -> Iterator[None]:
    """A :class:`~gym_bridge.collect.CollectError` exits 2 with its message; a file that cannot be written
    (:class:`~gym_bridge.records.jsonl.WriteFailed`, or any write that found no room: a full disk, a
    file-size limit, a quota) exits 1 naming it;
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
    except OSError as e:
        if not isinstance(e, WriteFailed) and e.errno not in _NO_ROOM:
            raise
        where = "" if isinstance(e, WriteFailed) or e.filename is None else f"{e.filename}: "
        console.print(f"[bold red]error:[/] {escape(where + str(e.strerror if where else e))}", highlight=False)
        console.print(f"the {kept} written before it are in {output}; free the space, then rerun with --resume "
                      "to do the rest", highlight=False)  # fmt: skip
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        console.print(f"interrupted: {kept} are in {output}; rerun with --resume to do the rest", markup=False)
        raise typer.Exit(130) from None
