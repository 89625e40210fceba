"""The ``gym-bridge`` command: ``serve``, ``collect``, ``reverify``, ``transform``, ``train``.

Start-up is kept cheap: no verb imports torch or transformers until it needs a local model.
"""

from __future__ import annotations

import typer

from gym_bridge.commands import collect, reverify, serve, train, transform

app = typer.Typer(
    help="gym-bridge: verifiable tasks -> rollouts -> RL training data -> GRPO.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)
app.add_typer(serve.app, name="serve")
app.add_typer(transform.app, name="transform")
app.command("collect")(collect.collect)
app.command("reverify")(reverify.reverify)
app.command("train")(train.train)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
