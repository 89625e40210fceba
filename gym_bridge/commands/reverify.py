"""``gym-bridge reverify``: re-score a stored rollout file with the current verifier (NeMo Gym's ``gym eval reverify``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gym_bridge.commands.options import EnvApiKey
from gym_bridge.serving.auth import bearer


def reverify(
    rollouts: Annotated[Path, typer.Argument(help="Rollout JSONL to re-score (ours or NeMo Gym's).", show_default=False)],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Re-scored rollouts JSONL to write.", show_default=False)
    ],
    env: Annotated[
        str,
        typer.Option(
            "--env", help="The verifier: a built-in server name (math, code, ...; started for the run) or a URL."
        ),
    ],
    concurrency: Annotated[int, typer.Option(help="/verify requests in flight at once.")] = 16,
    limit: Annotated[int | None, typer.Option(help="Re-score only the first N stored rollouts.")] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue an interrupted run: re-score only the rollouts the output lacks.")
    ] = False,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output (and its side files).")] = False,
    strict: Annotated[bool, typer.Option(help="Stop at the first unusable stored line instead of skipping it.")] = False,
    request_timeout: Annotated[float, typer.Option(help="Seconds for one /verify attempt.")] = 300.0,
    max_retries: Annotated[int, typer.Option(help="Retries per /verify on 429/5xx/timeouts/connection errors.")] = 3,
    examples: Annotated[int, typer.Option(help="How many changed rewards to show.")] = 5,
    env_api_key: EnvApiKey = None,
) -> None:
    """Re-verify ROLLOUTS against --env without calling a model; write -o, print how many rewards changed."""
    from rich.console import Console

    from gym_bridge.collect.reverify import ReverifyConfig
    from gym_bridge.collect.reverify import reverify as run_reverify
    from gym_bridge.commands.resumable import resumable_exit

    console = Console(stderr=True, soft_wrap=True)
    config = ReverifyConfig(
        rollouts_path=rollouts,
        output_path=output,
        env=env,
        concurrency=concurrency,
        resume=resume,
        overwrite=overwrite,
        strict=strict,
        limit=limit,
        request_timeout=request_timeout,
        max_retries=max_retries,
        max_examples=examples,
        env_headers=bearer(env_api_key),
    )

    def log(message: str) -> None:
        console.print(message, style="yellow", highlight=False, markup=False)

    with resumable_exit(console, output, "re-scored rollouts"):
        result = run_reverify(config, report=log)
    out = Console(soft_wrap=True)
    out.print(
        f"re-verified {result.total} rollouts ({result.verified} this run, {result.already_done} already done): "
        f"{result.changed} rewards changed ({result.raised} up, {result.lowered} down); "
        f"{result.failed} failed, {result.skipped} stored lines skipped",
        highlight=False,
    )
    for change in result.examples:
        out.print(
            f"  task {change.task_index} repeat {change.rollout_index}: reward {change.old} -> {change.new}",
            highlight=False,
        )
    out.print(f"rollouts: {result.output_path}", highlight=False)
    if result.masked:  # the env answered, but could not judge them (mask_sample): their reward is no verdict
        console.print(
            f"{'error' if result.masked == result.verified else 'warning'}: {result.masked} of the {result.verified} "
            "rollouts re-verified this run were masked by the env (mask_sample, e.g. its judge down or failing): "
            "their reward is no verdict; rerun reverify once the env can judge them",
            style="bold red" if result.masked == result.verified else "yellow", highlight=False, markup=False,
        )  # fmt: skip
    if result.failed:
        out.print(f"failures: {result.failures_path} (rerun with --resume to retry them)", highlight=False)
    if result.total == 0 and not result.failed:  # nothing to re-score is not a re-scored file
        console.print(
            f"error: {rollouts} holds no rollout to re-verify ({result.skipped} lines skipped)",
            style="bold red", highlight=False, markup=False,
        )  # fmt: skip
    if result.failed or result.total == 0 or (result.verified and result.masked == result.verified):
        raise typer.Exit(1)
