"""The Typer app every command group is built from, so that ``--help`` reads well anywhere.

Typer's rich help draws boxed tables sized to the terminal; piped or captured (no terminal) it is
80 columns wide and squeezes descriptions into a narrow column, cutting long option names. Without a
terminal the help is therefore click's plain text, with subcommands' descriptions wrapped rather than
cut. In both forms usage lines name arguments in
click's style (``TASKS``, ``[OVERRIDES]...``) and flags show no ``<bool>`` type.
"""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup


def _readable(params: list[Any]) -> list[Any]:
    """Upper-case argument names and no type column for flags (``--help`` included)."""
    for param in params:
        if param.param_type_name == "argument" and param.metavar is None:
            param.metavar = param.name.upper()
        elif getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


def _usage(command: Any, ctx: Any) -> list[str]:
    pieces = [command.options_metavar] if command.options_metavar else []
    for param in command.get_params(ctx):
        if param.param_type_name == "argument":
            name = param.metavar if param.required else f"[{param.metavar}]"
            pieces.append(name + ("..." if param.nargs != 1 else ""))
    return pieces


def _plain_when_piped(command: Any) -> None:
    if not sys.stdout.isatty():
        command.rich_markup_mode = None


class ReadableCommand(TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        return _readable(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _usage(self, ctx)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _plain_when_piped(self)
        super().format_help(ctx, formatter)


class ReadableGroup(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _readable(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*_usage(self, ctx), self.subcommand_metavar]

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """Each subcommand's whole first sentence, wrapped (click cuts it to one line with '...')."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=1_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _plain_when_piped(self)
        super().format_help(ctx, formatter)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """A usage error on a piped stderr is click's one ``Error: ...`` line, not a rich box whose
        message is cut at 80 columns."""
        if not sys.stderr.isatty():
            self.rich_markup_mode = None
        return super().main(*args, **kwargs)


class App(typer.Typer):
    """``typer.Typer`` whose groups and commands render their help as described above."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("cls", ReadableGroup)
        kwargs.setdefault("pretty_exceptions_show_locals", False)
        kwargs.setdefault("add_completion", False)
        super().__init__(**kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["cls"] = kwargs.get("cls") or ReadableCommand
        return super().command(*args, **kwargs)
