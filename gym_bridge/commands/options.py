"""What several commands take alike, declared once: the env servers' bearer token (its header is
:func:`gym_bridge.serving.auth.bearer`)."""

from __future__ import annotations

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
