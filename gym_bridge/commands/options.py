"""What several commands take alike, declared once: the env servers' bearer token (its header is
:func:`gym_bridge.serving.auth.bearer`), and the check of a file a command writes only at its end."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

ENV_API_KEY_VAR = "GYM_BRIDGE_ENV_API_KEY"

EnvApiKey = Annotated[
    str | None,
    typer.Option(
        envvar=ENV_API_KEY_VAR,
        help="Bearer token for the env server(s) started with 'serve <env> --token'.",
        show_default=False,
    ),
]
"""``--env-api-key`` (or ``GYM_BRIDGE_ENV_API_KEY``) of ``collect``, ``reverify`` and ``audit``."""


def report_path_problem(path: Path | None, flag: str) -> str | None:
    """Why ``path`` (given as ``flag``) cannot be written, or None; its directory is made if missing.

    Why: ``audit --json`` and ``eval ranked -o`` write their report after the whole run, and a path they
    could not write ended that run in a traceback, the report lost (audit's exit 1 then read as findings).
    """
    if path is None:
        return None
    if path.is_dir():
        return f"{flag} {path}: is a directory"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"{flag} {path}: cannot make its directory ({e.strerror or e})"
    if not os.access(path.parent, os.W_OK):
        return f"{flag} {path}: its directory is not writable"
    return None


def write_report(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file beside it, so a reader never sees half a report."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
