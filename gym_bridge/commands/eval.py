"""``gym-bridge eval ranked RANKED.jsonl --model M``: group ranking accuracy of a model on ranked groups.

The file is checked whole before the model loads, so a bad line fails at once as ``file:line: reason``
(exit 2) rather than after minutes of scoring. Outputs are written atomically (a temporary file renamed
on success). The metrics are defined in :mod:`gym_bridge.evaluation.ranked`.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from gym_bridge.commands.options import report_path_problem
from gym_bridge.commands.typer_app import App

app = App(help="Evaluate a model offline on stored data.", no_args_is_help=True)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _atomic_path(final: Path) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", dir=final.parent)
    os.close(fd)
    return Path(tmp)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"


@app.command()
def ranked(
    ranked_groups: Annotated[
        Path,
        typer.Argument(
            exists=True, dir_okay=False, readable=True, help="Ranked groups JSONL ({prompt, group: [{response, rank}]})."
        ),
    ],
    model: Annotated[
        str,
        typer.Option(
            "--model", "-m", help="A built-in name (tiny), a model directory or hub id, or a trainer checkpoint."
        ),
    ],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", dir_okay=False, help="Write the JSON report here.")
    ] = None,
    groups_out: Annotated[
        Path | None,
        typer.Option(
            "--groups-out", dir_okay=False, help="Write one JSONL line per group: members' scores and model ranks."
        ),
    ] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Responses per forward pass.")] = 8,
    limit: Annotated[int | None, typer.Option(min=1, help="Evaluate only the first N groups.")] = None,
    device: Annotated[str, typer.Option(help="torch device to score on.")] = "cpu",
) -> None:
    """Score each response by the model's mean token log-probability given the chat-templated prompt; report
    pairwise ranking accuracy, top-1 accuracy and Kendall's tau-b per group and overall."""
    from itertools import islice

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from gym_bridge.console import console
    from gym_bridge.evaluation.ranked import GroupResult, evaluate_ranked, iter_ranked
    from gym_bridge.records.jsonl import JsonlError

    for out in (output, groups_out):
        if out is not None and out.resolve() == ranked_groups.resolve():
            raise typer.BadParameter("an output must not be the input file")
    if output is not None and groups_out is not None and output.resolve() == groups_out.resolve():
        raise typer.BadParameter("must differ from --output (the report would replace the groups)", param_hint="--groups-out")
    for out, flag in ((output, "--output"), (groups_out, "--groups-out")):
        if problem := report_path_problem(out, flag):  # before the model is loaded and run, not after
            raise _fail(problem)
    try:
        total = sum(1 for _ in islice(iter_ranked(ranked_groups), limit))
    except (JsonlError, OSError) as err:
        raise _fail(str(err)) from None
    if total == 0:
        raise _fail(f"{ranked_groups}: no ranked groups")

    from gym_bridge.evaluation.scoring import ModelScorer
    from gym_bridge.models.registry import ModelNotFoundError
    from gym_bridge.train.bookkeeping.checkpoint import load_model_or_checkpoint

    try:
        lm, tokenizer = load_model_or_checkpoint(model, device=device)
    except (ModelNotFoundError, ValueError, OSError, RuntimeError) as err:
        raise _fail(f"--model {model}: {err}") from None
    scorer = ModelScorer(lm, tokenizer, batch_size=batch_size)

    err_console = console(stderr=True)
    groups_tmp = _atomic_path(groups_out) if groups_out is not None else None
    groups_file = groups_tmp.open("w", encoding="utf-8") if groups_tmp is not None else None
    columns = (
        TextColumn("[bold]ranking"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("groups  pairwise {task.fields[accuracy]}"),
        TimeRemainingColumn(),
    )
    pooled = [0.0, 0]
    try:
        with Progress(*columns, console=err_console, transient=True, disable=not err_console.is_terminal) as bar:
            task = bar.add_task("ranking", total=total, accuracy="n/a")

            def on_group(result: GroupResult) -> None:
                pooled[0] += result.correct_pairs
                pooled[1] += result.pairs
                if groups_file is not None:
                    groups_file.write(json.dumps(result.to_json(), ensure_ascii=False) + "\n")
                bar.update(task, advance=1, accuracy=_fmt(pooled[0] / pooled[1] if pooled[1] else None))

            report = evaluate_ranked(islice(iter_ranked(ranked_groups), limit), scorer, on_group=on_group)
    except (JsonlError, OSError) as err:  # the file changed since it was checked
        raise _fail(str(err)) from None
    except BaseException:
        if groups_tmp is not None:
            groups_file.close()  # type: ignore[union-attr]
            groups_tmp.unlink(missing_ok=True)
        raise
    if groups_file is not None and groups_tmp is not None and groups_out is not None:
        groups_file.close()
        os.replace(groups_tmp, groups_out)

    summary: dict[str, Any] = {
        "file": str(ranked_groups),
        "model": model,
        "score": "mean token log-probability of the response given the chat-templated prompt",
        **report.summary(),
        "truncated_sequences": scorer.truncated,
    }
    if output is not None:
        tmp = _atomic_path(output)
        tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, output)
    typer.echo(
        f"{summary['groups']} groups ({summary['rankable_groups']} with an order, {summary['pairs']} pairs): "
        f"pairwise accuracy {_fmt(summary['pairwise_accuracy'])}, top-1 {_fmt(summary['top1_accuracy'])}, "
        f"Kendall tau-b {_fmt(summary['kendall_tau'])}"
    )
    if summary["rankable_groups"] < summary["groups"]:
        flat = summary["groups"] - summary["rankable_groups"]
        typer.echo(f"  {flat} group{'s' if flat > 1 else ''} with every member at one rank (nothing to order, skipped)")
    if scorer.truncated:
        typer.echo(f"  {scorer.truncated} sequences were longer than the model's context (prompt cut from the left)")
    for label, path in (("report", output), ("groups", groups_out)):
        if path is not None:
            typer.echo(f"{label}: {path}")
    if summary["rankable_groups"] == 0:  # no figure was measured: not a passed evaluation
        typer.echo(f"error: no group of {ranked_groups} has an order to check (every member at one rank)", err=True)
        raise typer.Exit(1)
