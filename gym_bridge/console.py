"""The rich consoles gym-bridge prints through: a line is never hard-wrapped when the output is piped.

Off a terminal rich assumes 80 columns and breaks lines there, mid-phrase (``loss \\n0.507``), so a
log or ``| tee`` shows broken lines and tables with wrapped cells. These consoles soft-wrap (a line is
written whole; a terminal folds it) and, piped with no ``$COLUMNS``, lay tables out up to
:data:`PIPED_WIDTH` columns wide, which a table only takes as far as its content needs. A terminal
keeps its own width, and ``$COLUMNS`` still sets it when given.
"""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console

__all__ = ["PIPED_WIDTH", "console"]

PIPED_WIDTH = 1000
"""Columns a piped console lays tables out in: wider than any row gym-bridge prints."""


def console(*, stderr: bool = False, **kwargs: Any) -> Console:
    """A soft-wrapping rich :class:`~rich.console.Console` on stdout (``stderr``: on stderr), as wide
    as the terminal or ``$COLUMNS``, else :data:`PIPED_WIDTH`; ``kwargs`` go to ``Console``."""
    made = Console(stderr=stderr, soft_wrap=True, **kwargs)
    if not made.is_terminal and "width" not in kwargs and not os.environ.get("COLUMNS", "").isdigit():
        made.width = PIPED_WIDTH
    return made
