"""``gym-bridge view FILE [FILE2] | RUN_DIR``: open rollouts or a training run in a local web page."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from gym_bridge.serving.request_guard import ALLOWED_HOST_HELP, check_host_names


def view(
    paths: Annotated[
        list[Path],
        typer.Argument(help="A rollout JSONL file, two files to compare (before, after), or a training log dir."),
    ],
    host: Annotated[str, typer.Option(help="Interface to bind; loopback by default.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0 picks a free one).")] = 8080,
    token: Annotated[
        str | None, typer.Option(help="Require 'Authorization: Bearer TOKEN' (a browser opens the printed URL once).")
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(help="Decode token ids with this tokenizer: 'tiny' or a local tokenizer directory."),
    ] = None,
    allowed_host: Annotated[list[str] | None, typer.Option(metavar="NAME", help=ALLOWED_HOST_HELP)] = None,
) -> None:
    """Serve a rollout viewer: tasks, groups with advantages, tokens, run comparison, training curves."""
    from gym_bridge.serving.uvicorn_thread import start_in_thread
    from gym_bridge.viewer.app import Viewer, build_app

    if tokenizer is not None and tokenizer != "tiny" and not os.path.isdir(tokenizer):
        typer.echo(f"error: --tokenizer {tokenizer!r}: not 'tiny' and not a directory", err=True)
        raise typer.Exit(2)
    try:
        check_host_names(allowed_host or [], "--allowed-host")
        viewer = Viewer.for_paths(paths, tokenizer=tokenizer)
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    viewer.start()
    try:
        app = build_app(viewer, token=token, allowed_hosts=[host, *(allowed_host or [])])
        running = start_in_thread(app, host=host, port=port)
    except (OSError, RuntimeError, TimeoutError) as err:
        typer.echo(f"error: cannot serve on {host}:{port}: {err}", err=True)
        raise typer.Exit(2) from None
    url = running.url + (f"/?token={token}" if token else "/")
    typer.echo(f"gym-bridge view: {url}", color=False)
    try:
        running._thread.join()
    except KeyboardInterrupt:
        running.stop()
