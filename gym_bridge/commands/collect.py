"""``gym-bridge collect``: run every task row against a model and an env, write NeMo Gym rollouts.

Cheap to start: torch and transformers are imported only with ``--policy``.
"""

from __future__ import annotations

import enum
import json
import math
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from gym_bridge.commands.options import EnvApiKey
from gym_bridge.commands.typer_app import ReadableCommand
from gym_bridge.serving.auth import bearer

ENV_HELP = (
    "Environment: a built-in name (math, code, tool_use; started in-process for the run), a URL, or "
    "KEY=NAME_OR_URL. Repeat for several; rows then go to the env keyed by their 'env' field or "
    "agent_ref.name (a '_simple_agent'/'_agent' suffix may be left off), else to the one keyed 'default' "
    "or given as a bare URL."
)

ENV_TRANSPORT_HELP = (
    "How to call the envs this run starts itself (--env math, --env module:Class): 'in-process' calls their "
    "apps on the run's own event loop (the same requests and answers as HTTP, less CPU); 'http' serves each "
    "on a loopback port (for an env that needs a real socket, or whose handlers block the event loop). "
    "Envs given by URL always go over HTTP."
)

RAY_HELP = (
    "Run the rollouts on a Ray cluster: one shard per node, each with its own built-in envs (--env math); "
    "this process alone writes -o, so --resume works as without Ray. ADDRESS (or RAY_ADDRESS) joins a running "
    "cluster (e.g. 10.0.0.1:6379 after 'ray start --head'); bare --ray starts a private Ray on 127.0.0.1 "
    "(give it after TASKS, or it takes TASKS for the address). Needs --model-url reachable from every node, "
    "and the [ray] extra."
)


class EnvTransportChoice(str, enum.Enum):
    """``--env-transport``'s values (:data:`gym_bridge.collect.config.ENV_TRANSPORTS`)."""

    in_process = "in-process"
    http = "http"


class CollectCommand(ReadableCommand):
    """``collect`` with ``--ray [ADDRESS]``: an option whose value may be left off, which Typer has not
    (and its vendored click is not ours to reach into): a bare ``--ray`` is given the value ``local``."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        from gym_bridge.collect.ray_shards import LOCAL

        args = list(args)
        for i, arg in enumerate(args):
            if arg == "--":
                break
            if arg == "--ray" and (i + 1 == len(args) or args[i + 1].startswith("-")):
                args.insert(i + 1, LOCAL)
                break
        return super().parse_args(ctx, args)


def parse_params(values: list[str], option: str = "--param") -> dict[str, Any]:
    """``["temperature=0.2", "metadata={\\"a\\": 1}", "model=m"]`` -> a dict; values are JSON when they parse."""
    params: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise typer.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint=option)
        try:
            params[key] = json.loads(raw)
        except ValueError:
            params[key] = raw
    return params


def collect(
    tasks: Annotated[
        Path, typer.Argument(help="Task rows (JSONL with responses_create_params).", show_default=False)
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Rollouts JSONL to write.", show_default=False)
    ],
    env: Annotated[list[str], typer.Option("--env", help=ENV_HELP, show_default=False)],
    model_url: Annotated[
        str | None, typer.Option(help="OpenAI-compatible API base URL, e.g. http://127.0.0.1:8000/v1.")
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(help="Serve this embedded model (tiny, smollm2-135m, a directory) for the run."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="'model' to put in every request.")] = None,
    concurrency: Annotated[int, typer.Option(help="Rollouts in flight at once.")] = 16,
    workers: Annotated[
        int,
        typer.Option(
            help="Processes that run the rollouts: 1 runs them in this process; N > 1 starts N worker "
            "processes (each with its own envs and connections; --concurrency is the total) while this "
            "process alone writes the files, so --resume works as with 1. Helps when one core is the limit "
            "(a fast model); docs/guides/collect.md.",
        ),
    ] = 1,
    num_repeats: Annotated[int, typer.Option(help="Rollouts per task (NeMo Gym's aabbcc order).")] = 1,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature for every request.")] = None,
    top_p: Annotated[float | None, typer.Option(help="Nucleus sampling top_p for every request.")] = None,
    max_output_tokens: Annotated[
        int | None, typer.Option(help="Cap on generated tokens per model call.")
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            help="Override any responses_create_params field: KEY=VALUE (VALUE read as JSON if it parses)."
        ),
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Use only the first N task rows.")] = None,
    seed: Annotated[
        int | None,
        typer.Option(help="Send each rollout a 'seed' derived from this, its task and its repeat."),
    ] = None,
    max_steps: Annotated[int, typer.Option(help="Most model calls per rollout (0: no limit).")] = 32,
    resume: Annotated[
        bool, typer.Option(help="Continue an interrupted run: make only the rollouts the output lacks.")
    ] = False,
    overwrite: Annotated[
        bool, typer.Option(help="Replace an existing output (and its failures/metrics).")
    ] = False,
    strict: Annotated[
        bool, typer.Option(help="Stop at the first bad task row instead of skipping it.")
    ] = False,
    request_timeout: Annotated[
        float | None,
        typer.Option(
            help="Seconds for one HTTP request attempt. Default: sized so a slow model can answer "
            "--concurrency requests of --max-output-tokens (1024 if unset) at 10 tokens/s in all: "
            "60 + concurrency x tokens / 10, within 300-3600.",
            show_default=False,
        ),
    ] = None,
    rollout_timeout: Annotated[
        float | None,
        typer.Option(
            metavar="SECONDS",
            help="Seconds one whole rollout may take: set-up, every model and tool call, /verify, their retries "
            "and waits. Past it the rollout is cut off and written to the failures file as rollout_timeout "
            "(one request that never answers then costs this, not --request-timeout x attempts). Default: none.",
            show_default=False,
        ),
    ] = None,
    max_retries: Annotated[
        int,
        typer.Option(help="Retries per request on 429/5xx/connection errors (and timeouts, with --retry-timeouts)."),
    ] = 3,
    retry_timeouts: Annotated[
        bool,
        typer.Option(
            help="Send a timed-out request again. Off by default: the server may still be working on it, "
            "and a slow model asked twice only gets slower."
        ),
    ] = False,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="OPENAI_API_KEY", help="Bearer token for the model endpoint.", show_default=False
        ),
    ] = None,
    env_api_key: EnvApiKey = None,
    env_transport: Annotated[
        EnvTransportChoice, typer.Option(help=ENV_TRANSPORT_HELP, case_sensitive=False)
    ] = EnvTransportChoice.in_process,
    user_model_url: Annotated[
        str | None,
        typer.Option(
            help="LLM user of multi-turn rows (those with user_instructions, customer_scenario or a user_script): "
            "an OpenAI-compatible base URL, or 'policy' for the run's own model. Default: rows with a "
            "user_script get a scripted user (docs/guides/multi-turn.md).",
            show_default=False,
        ),
    ] = None,
    user_param: Annotated[
        list[str] | None,
        typer.Option(help="The LLM user's responses_create_params: KEY=VALUE (VALUE read as JSON if it parses)."),
    ] = None,
    max_user_turns: Annotated[
        int, typer.Option(help="Most user messages after the task prompt in a conversation.")
    ] = 8,
    max_conversation_tokens: Annotated[
        int | None,
        typer.Option(
            help="End a conversation once the policy's last call used this many tokens (input + output).",
            show_default=False,
        ),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    ray: Annotated[
        str | None, typer.Option("--ray", metavar="[ADDRESS]", help=RAY_HELP, show_default=False)
    ] = None,
    max_failed_fraction: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Exit 1 when more than this share of the run's rollouts failed or were masked by their env "
            "(mask_sample, e.g. a judge down; as grpo.max_failed_rollouts_fraction does in training; 0: any "
            "failure). A run in which no rollout succeeded, or every one written was masked, exits 1 whatever "
            "this is. The rollouts that did succeed are kept either way.",
        ),
    ] = 1.0,
) -> None:
    """Collect verified rollouts: TASKS x repeats through the model and the env, into -o (NeMo Gym format)."""
    from gym_bridge.collect import CollectConfig
    from gym_bridge.collect import collect as run_collect
    from gym_bridge.commands.resumable import resumable_exit
    from gym_bridge.console import console as rich_console

    console = rich_console(stderr=True)
    overrides = parse_params(param or [])
    for key, value in (
        ("model", model),
        ("temperature", temperature),
        ("top_p", top_p),
        ("max_output_tokens", max_output_tokens),
    ):
        if value is not None:
            overrides[key] = value
    config = CollectConfig(
        tasks_path=tasks,
        output_path=output,
        envs=env,
        model_url=model_url,
        policy=policy,
        concurrency=concurrency,
        workers=workers,
        num_repeats=num_repeats,
        overrides=overrides,
        limit=limit,
        seed=seed,
        max_steps=max_steps or None,
        resume=resume,
        overwrite=overwrite,
        strict=strict,
        request_timeout=request_timeout,
        max_retries=max_retries,
        rollout_timeout=rollout_timeout,
        retry_timeouts=retry_timeouts,
        model_headers=bearer(api_key),
        env_headers=bearer(env_api_key),
        env_transport=env_transport.value,
        user_model_url=user_model_url,
        user_params=parse_params(user_param or [], "--user-param"),
        max_user_turns=max_user_turns,
        max_conversation_tokens=max_conversation_tokens,
    )
    bar = _ProgressBar(console, enabled=progress)
    # no bar: nothing to tell per rollout (rich keeps a hidden bar's books too, a few Python calls a rollout)
    shown = {"on_progress": bar.advance, "on_start": bar.start} if progress else {}
    with resumable_exit(console, output, "finished rollouts"), bar:
        if ray is None:
            result = run_collect(config, report=bar.log, **shown)
        else:
            from gym_bridge.collect.ray_shards import collect_on_ray

            result = collect_on_ray(config, ray, report=bar.log, **shown)
    _print_summary(console, result, timeout_origin=config.timeout_origin())
    _exit_on_failures(console, result, max_failed_fraction, tasks)


def _exit_on_failures(console: Any, result: Any, max_failed_fraction: float, tasks: Path) -> None:
    """Print the run's first distinct failure causes; exit 1 when no rollout succeeded or more than
    ``max_failed_fraction`` of them failed (a run that did not do its job must not exit 0)."""
    from gym_bridge.collect.summary import failure_causes

    if not (result.failed or result.written or result.already_done):  # an empty task file is no run
        console.print(
            f"error: no task rows to run in {tasks}; nothing was collected",
            style="bold red", highlight=False, markup=False,
        )  # fmt: skip
        raise typer.Exit(1)
    run = result.metrics.get("run") or {}
    masked = run.get("rollouts_masked") or 0  # written with mask_sample: the env could not judge them
    if masked:
        kinds = ", ".join(f"{n} x {k}" for k, n in sorted(run.get("masked_by_kind", {}).items(), key=lambda kv: -kv[1]))
        console.print(
            f"warning: {masked} of {result.written} rollouts written this run were masked by their env ({kinds}): "
            "it could not judge them (a judge down or failing), so their reward is no score; rescore them with "
            "`gym-bridge reverify` once it can",
            style="yellow", highlight=False, markup=False,
        )  # fmt: skip
    if not (result.failed or masked):
        return
    for kind, error, count in failure_causes(result.failures_path, result.failed):
        console.print(f"failure cause ({kind}, {count}x): {error}", highlight=False, markup=False)
    rollouts_failed = result.failed - result.skipped_rows
    attempted = result.written + rollouts_failed
    unscored = rollouts_failed + masked  # masked ones count toward the threshold, as in training
    if result.written == 0:
        problem = f"no rollout succeeded ({result.failed} failed)"
    elif masked == result.written:
        problem = f"no rollout was scored: every one written this run ({masked}) was masked by its env"
    elif attempted and unscored / attempted > max_failed_fraction:
        also = f" and {masked} {'was' if masked == 1 else 'were'} masked" if masked else ""
        problem = (
            f"{rollouts_failed} of {attempted} rollouts failed{also} ({unscored / attempted:.1%}), more than "
            f"--max-failed-fraction {max_failed_fraction:g}"
        )
    else:
        return
    redo = "then rerun with --resume to make only the missing rollouts"
    if masked:
        redo += " and rescore the masked ones with `gym-bridge reverify`" if result.failed else ""
        redo = redo if result.failed else "then rescore the masked rollouts with `gym-bridge reverify`"
    console.print(
        f"error: {problem}; the finished rollouts are kept in {result.output_path}, the failures in "
        f"{result.failures_path}: fix the cause, {redo}",
        style="bold red",
        highlight=False,
        markup=False,
    )
    raise typer.Exit(1)


class _ProgressBar:
    """A rich progress bar with rollouts/s, running mean reward and failures (fed by the collector)."""

    def __init__(self, console: Any, enabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console
        self.progress = Progress(
            TextColumn("[bold]collect"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:>7.1f} rollouts/s"),
            TextColumn("reward {task.fields[reward]}"),
            TextColumn("failed {task.fields[failed]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
        )
        self.task: Any = None
        self._last_fields = 0.0
        self._unshown = 0  # rollouts counted since the bar was last moved

    def __enter__(self) -> _ProgressBar:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.task is not None and self._unshown:
            self.progress.advance(self.task, self._unshown)
        self.progress.__exit__(*exc)

    def start(self, total: int) -> None:
        self.task = self.progress.add_task("collect", total=total, rate=0.0, reward="-", failed=0)

    def log(self, message: str) -> None:
        self.console.print(message, style="yellow", highlight=False, markup=False)

    def advance(self, stats: Any, n: int) -> None:
        """Count ``n`` rollouts; the bar moves at most ten times a second (rich's books cost a few calls)."""
        if self.task is None:
            return
        self._unshown += n
        now = time.monotonic()
        if now - self._last_fields < 0.1:
            return
        self._last_fields = now
        mean = stats.mean_reward
        self.progress.update(
            self.task,
            advance=self._unshown,
            rate=stats.rate,
            reward="-" if mean is None else f"{mean:.3f}",
            failed=stats.failed,
        )
        self._unshown = 0


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _print_summary(console: Any, result: Any, *, timeout_origin: str) -> None:
    """The run's numbers as a table; ``timeout_origin``: where the per-attempt request timeout came from
    (:meth:`~gym_bridge.collect.CollectConfig.timeout_origin`)."""
    from rich.table import Table

    m = result.metrics
    run = m.get("run", {})
    table = Table(title="collect: summary", show_header=False, title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    rows = [
        ("rollouts in output", m.get("num_rollouts")),
        ("tasks", m.get("num_tasks")),
        ("mean reward", m.get("mean_reward")),
    ]
    rows += [(k, v) for k, v in m.items() if k.startswith(("pass@", "majority@"))]
    rows += [(f"mean reward_components.{k}", v) for k, v in (m.get("reward_components") or {}).items()]
    rows += [
        ("written this run", run.get("rollouts_written")),
        ("failed this run", run.get("rollouts_failed")),
        ("bad task rows", run.get("bad_task_rows")),
        ("rollouts/s", run.get("rollouts_per_s")),
        (
            "model latency p50/p90/p99 (s)",
            "/".join(_fmt(run.get("model_latency_s", {}).get(q)) for q in ("p50", "p90", "p99")),
        ),
        ("tokens in/out", f"{run.get('input_tokens', 0)}/{run.get('output_tokens', 0)}"),
        ("retries (requests sent again)", run.get("retries")),
        (f"request timeout per attempt (s, {timeout_origin})", run.get("request_timeout_s")),
    ]
    for name, count in sorted(run.get("failures_by_class", {}).items()):
        rows.append((f"failures: {name}", count))
    if run.get("rollouts_masked"):  # kept, but the env could not judge them (mask_sample)
        rows.append(("masked this run (mask_sample)", run["rollouts_masked"]))
        rows += [(f"masked: {name}", n) for name, n in sorted(run.get("masked_by_kind", {}).items())]
    for w in run.get("worker_processes", []):  # --workers: rollouts (failed) per process
        rows.append((f"worker process {w.get('worker')} (pid {w.get('pid')})", f"{w.get('rollouts')} ({w.get('failed')} failed)"))
    for shard in (run.get("ray") or {}).get("shards", []):  # --ray: rollouts (failed) per node
        node = f"node {str(shard.get('node_id'))[:12]} ({shard.get('node_ip')})"
        rows.append((f"ray shard {shard.get('shard')}: {node}", f"{shard.get('rollouts')} ({shard.get('failed')} failed)"))
    for name, value in rows:
        table.add_row(name, _fmt(value))
    console.print(table)
    console.print(f"rollouts: {result.output_path}")
    console.print(f"metrics:  {result.metrics_path}")
    from gym_bridge.collect import aggregate_metrics_path_for, materialized_path_for

    console.print(f"NeMo Gym: {materialized_path_for(result.output_path)}")
    if result.aggregate_metrics:
        console.print(f"NeMo Gym: {aggregate_metrics_path_for(result.output_path)}")
    if result.failed:
        console.print(f"failures: {result.failures_path} (rerun with --resume to retry them)")
