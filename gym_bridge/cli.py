"""The ``gym-bridge`` command: ``serve``, ``collect``, ``reverify``, ``transform``, ``eval``, ``train``, ``view``, ``audit``.

Start-up is kept cheap: no verb imports torch or transformers until it needs a local model.
"""

from __future__ import annotations

from typing import Annotated

import typer

import gym_bridge
from gym_bridge.commands import audit, collect, reverify, serve, train, transform, view
from gym_bridge.commands import eval as eval_command
from gym_bridge.commands.typer_app import App

app = App(help="gym-bridge: verifiable tasks -> rollouts -> RL training data -> GRPO.", invoke_without_command=True)
app.add_typer(serve.app, name="serve")
app.add_typer(transform.app, name="transform")
app.add_typer(eval_command.app, name="eval")
app.command("collect", cls=collect.CollectCommand)(collect.collect)
app.command("reverify")(reverify.reverify)
app.command("train")(train.train)
app.command("view")(view.view)
app.command("audit")(audit.audit)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"gym-bridge {gym_bridge.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """gym-bridge: verifiable tasks -> rollouts -> RL training data -> GRPO."""
    if ctx.invoked_subcommand is None:  # plain `gym-bridge`: the help, on stdout, piped or not
        typer.echo(ctx.get_help())
        raise typer.Exit()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
