"""``gym-bridge audit``: run the hostile suite against a resources server and report what it let through."""

from __future__ import annotations

import asyncio
import json
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated

import typer

from gym_bridge.commands.options import EnvApiKey, report_path_problem, write_report
from gym_bridge.serving.auth import bearer


def audit(
    url: Annotated[str, typer.Argument(help="The resources server's base URL, e.g. http://127.0.0.1:8001.")],
    env: Annotated[
        str, typer.Option("--env", help="Which catalogue: math, code, tool_use, reasoning_gym or judge.")
    ],
    strict: Annotated[
        bool,
        typer.Option(
            help="Also count answers the NeMo Gym default pays by design (math: relations, negations, "
            "approximations, trailing prose); use it against a server run in its strict mode."
        ),
    ] = False,
    stall_s: Annotated[
        float, typer.Option(help="Seconds an answer may take before it counts as a stall.")
    ] = 30.0,
    code_cpu_limit: Annotated[
        float,
        typer.Option(
            help="The code server's CPU seconds per test (--env code): the CPU attacks spend 1.7x it."
        ),
    ] = 4.0,
    only: Annotated[
        list[str] | None,
        typer.Option("--only", help="Run only this attack (repeatable; the controls always run)."),
    ] = None,
    judge_port: Annotated[
        int | None,
        typer.Option(
            help="Serve the audit's gullible judge model on 127.0.0.1:PORT while it runs (--env judge): "
            "start the judge server with --judge-url http://127.0.0.1:PORT/v1.",
            show_default=False,
        ),
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the whole report as JSON here.", show_default=False)
    ] = None,
    env_api_key: EnvApiKey = None,
) -> None:
    """Attack the server at URL as a reward-hacking policy and a hostile web page would; exit 1 on any finding.

    Every attack runs through the real agent loop (seed_session, the scripted model's turns, tool calls,
    verify), so the server sees what a policy would send. Findings are filed under wrong-reward, crash,
    stall and escape/leak. Exit 0: nothing found; 1: findings; 2: the audit could not run (unreachable
    server, or the honest control answers did not score 1).
    """
    from gym_bridge.audit import run_audit
    from gym_bridge.audit.attacks import AuditOptions
    from gym_bridge.audit.envs import ENVS
    from gym_bridge.audit.report import print_report
    from gym_bridge.audit.run import AuditError
    from gym_bridge.console import console

    err = console(stderr=True)
    if problem := report_path_problem(json_path, "--json"):  # before the run, not after it
        err.print(f"error: {problem}", markup=False, highlight=False)
        raise typer.Exit(2)
    if env not in ENVS:
        err.print(
            f"error: --env must be one of {', '.join(ENVS)}; got {env!r}", markup=False, highlight=False
        )
        raise typer.Exit(2)
    known = {a.name for a in ENVS[env].attacks(AuditOptions(strict=True))} | _raw_names(env)
    unknown = sorted(set(only or ()) - known)
    if unknown:
        err.print(
            f"error: --only: no attack named {', '.join(unknown)} for --env {env}",
            markup=False,
            highlight=False,
        )
        raise typer.Exit(2)
    with ExitStack() as stack:
        if judge_port is not None:
            from gym_bridge.audit.envs.judge import GullibleJudge
            from gym_bridge.serving.uvicorn_thread import start_in_thread

            try:
                running = start_in_thread(GullibleJudge().app(), port=judge_port)
            except (RuntimeError, TimeoutError) as e:
                err.print(f"error: --judge-port {judge_port}: cannot serve the judge there ({e}; is the port taken?)",
                          markup=False, highlight=False)  # fmt: skip
                raise typer.Exit(2) from None
            stack.callback(running.stop)
            err.print(f"gullible judge model on {running.url}/v1", highlight=False)
        try:
            report = asyncio.run(
                run_audit(
                    url,
                    env,
                    stall_s=stall_s,
                    options=AuditOptions(strict=strict, code_cpu_limit_s=code_cpu_limit),
                    headers=bearer(env_api_key),
                    only=set(only) if only else None,
                    progress=lambda o: err.print(
                        f"  {o.attack}: {len(o.findings)} finding(s)", highlight=False, markup=False
                    ),  # fmt: skip
                )
            )
        except AuditError as e:
            err.print(f"error: {e}", markup=False, highlight=False)
            raise typer.Exit(2) from None
    print_report(report, console())
    if json_path is not None:
        try:
            write_report(json_path, json.dumps(report.to_json(), indent=2) + "\n")
        except OSError as e:
            err.print(f"error: --json {json_path}: {e.strerror or e} (the report is above)", markup=False, highlight=False)
            raise typer.Exit(2) from None
    if report.findings:
        raise typer.Exit(1)


def _raw_names(env: str) -> set[str]:
    from gym_bridge.audit.envs import catalogue

    return {r.name for r in catalogue(env)[1]}
