"""``gym-bridge transform``: rollout JSONL -> NeMo RL training data (GRPO, SFT, DPO, ranked groups).

Every verb streams its input, reports bad lines as ``file:line`` (skipped, or fatal with ``--strict``),
writes its output atomically (temp file renamed on success) and ends with a count of written, skipped
and filtered records. A rollout without a reward is a bad line (``grpo --missing-reward`` scores it
explicitly), a cut-off response is no SFT demonstration nor DPO chosen answer (``--keep-cut-off``), and
a NaN bound is refused. The conversions themselves live in the ``transforms`` package.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gym_bridge.commands.typer_app import App
from gym_bridge.console import console as rich_console
from gym_bridge.records.jsonl import JsonlError
from transforms.common import check_rollout, check_scored_rollout, in_reward_range, is_cut_off, reward_of
from transforms.dpo import dpo_pairs
from transforms.grpo import check_keys, to_grpo, to_grpo_chat
from transforms.pipeline import EmptyOutput, TransformReport, run_grouped, run_records
from transforms.ranked import check_ranked, ranked_to_grpo, to_ranked
from transforms.sft import to_sft

app = App(
    help="Turn rollout JSONL into NeMo RL training data: grpo, sft, dpo, ranked (and ranked-to-grpo).",
    no_args_is_help=True,
)

_SHOWN_ERRORS = 20


class GrpoFormat(str, enum.Enum):
    responses = "responses"
    chat = "chat"


class PairFormat(str, enum.Enum):
    text = "text"
    chat = "chat"


InPath = Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="Input JSONL.")]
OutPath = Annotated[
    Path, typer.Option("--output", "-o", dir_okay=False, help="Output JSONL (written atomically).")
]
Strict = Annotated[bool, typer.Option("--strict", help="Stop at the first bad line instead of skipping it.")]
InputKey = Annotated[str, typer.Option(help="Key for the prompt text (NeMo RL input_key).")]
OutputKey = Annotated[str, typer.Option(help="Key for the response text (NeMo RL output_key).")]
RewardKey = Annotated[str, typer.Option(help="Key for the reward.")]


def _number(value: float | None) -> float | None:
    """A float option's value; NaN refused (every comparison with it is false: a NaN bound filtered
    everything out, a NaN default reward would be written as a reward)."""
    if value is not None and math.isnan(value):
        raise typer.BadParameter("must be a number, not NaN")
    return value


def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"must be a finite number, got {value}")
    return value


KeepCutOff = Annotated[
    bool,
    typer.Option(
        "--keep-cut-off",
        help="Also use a response that was cut off (status incomplete, e.g. at max_output_tokens); by default "
        "it is no demonstration or chosen answer: its text stops mid-answer.",
    ),
]


class _ErrorPrinter:
    """Print the first bad lines as they come; count the rest for the summary."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.count = 0

    def __call__(self, err: JsonlError) -> None:
        self.count += 1
        if self.count <= _SHOWN_ERRORS:
            self.console.print(f"[yellow]skipped[/] {err}", markup=True, highlight=False)


def _run(
    in_path: Path,
    out_path: Path,
    strict: bool,
    pipeline: Callable[..., TransformReport],
    convert: Callable[[Any], Any],
    **options: Any,
) -> None:
    """Stream ``in_path`` through ``pipeline`` (``run_records`` or ``run_grouped``) with ``convert``, print
    the bad lines and a summary table; a bad line under ``--strict`` exits 1 with nothing written."""
    if out_path.resolve() == in_path.resolve():
        raise typer.BadParameter("the output must not be the input file", param_hint="--output")
    err_console = rich_console(stderr=True)
    printer = _ErrorPrinter(err_console)
    try:
        report = pipeline(in_path, out_path, convert, strict=strict, on_error=printer, allow_empty=False, **options)
    except JsonlError as e:
        err_console.print(f"[red]error[/] {escape(str(e))}", highlight=False)
        err_console.print(f"nothing written to {out_path} (--strict)", highlight=False, markup=False)
        raise typer.Exit(1) from None
    except EmptyOutput as e:  # an empty training file is not a transform's job done
        err_console.print(f"[red]error[/] {escape(str(e))}", highlight=False)
        raise typer.Exit(1) from None
    except OSError as e:  # a full disk, a directory that cannot be made: the output stays as it was
        where = e.filename if e.filename is not None else out_path
        err_console.print(f"[red]error[/] {escape(str(where))}: {escape(e.strerror or str(e))}", highlight=False)
        err_console.print(f"nothing written to {out_path}", highlight=False, markup=False)
        raise typer.Exit(1) from None
    if printer.count > _SHOWN_ERRORS:
        err_console.print(f"... and {printer.count - _SHOWN_ERRORS} more bad lines", highlight=False)
    table = Table(show_header=False, box=None)
    table.add_row("input", str(in_path))
    table.add_row("output", str(out_path))
    table.add_row("written", str(report.written))
    table.add_row("skipped (bad lines)", str(report.skipped))
    table.add_row("filtered" + (" (tasks)" if report.groups is not None else ""), str(report.filtered))
    if report.groups is not None:
        table.add_row("tasks", str(report.groups))
        table.add_row("duplicates left out", str(report.duplicates))
    console = rich_console()
    console.print(table)
    if report.note:
        console.print(f"note: {report.note}", highlight=False)


def _check_keys(keys: dict[str, str]) -> None:
    """The output's keys (``{label: key}``) are distinct (else one would overwrite another in every
    record): exit 2."""
    try:
        check_keys(**keys)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def _split_fields(keep_fields: str | None) -> tuple[str, ...]:
    return tuple(f.strip() for f in (keep_fields or "").split(",") if f.strip())


def _reward_filtered(
    convert: Callable[[dict[str, Any]], dict[str, Any]],
    min_reward: float | None,
    max_reward: float | None,
    missing_reward: float | None = None,
) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    """``convert`` for the records whose reward (``missing_reward`` where it has none) is within
    [min_reward, max_reward]; None (filtered) for the rest."""

    def filtered(record: dict[str, Any]) -> dict[str, Any] | None:
        reward = reward_of(record, missing_reward)
        return convert(record) if in_reward_range(reward, min_reward, max_reward) else None

    return filtered


@app.command()
def grpo(
    rollouts: InPath,
    output: OutPath,
    input_key: InputKey = "input",
    output_key: OutputKey = "output",
    reward_key: RewardKey = "reward",
    min_reward: Annotated[
        float | None, typer.Option(help="Keep rollouts with reward >= this.", callback=_number)
    ] = None,
    max_reward: Annotated[
        float | None, typer.Option(help="Keep rollouts with reward <= this.", callback=_number)
    ] = None,
    missing_reward: Annotated[
        float | None,
        typer.Option(
            help="Score a rollout without a reward as this (NeMo Gym's documented script reads it as 0); "
            "by default it is a bad line, skipped and named.",
            callback=_finite,
        ),
    ] = None,
    fmt: Annotated[
        GrpoFormat,
        typer.Option(
            "--format", help="responses: {input, output, reward}; chat: {messages, task_name, reward}."
        ),
    ] = GrpoFormat.responses,
    task_name: Annotated[
        str | None, typer.Option(help="task_name for --format chat (default: agent_ref name or env).")
    ] = None,
    prompt_only: Annotated[
        bool, typer.Option(help="--format chat: prompt messages only, no assistant turn (online GRPO).")
    ] = False,
    keep_fields: Annotated[
        str | None, typer.Option(help="Comma-separated task fields to carry over, e.g. expected_answer.")
    ] = None,
    strict: Strict = False,
) -> None:
    """Rollouts -> NeMo RL GRPO records (ResponseDataset input/output/reward, or HF chat with task_name)."""

    kept = _split_fields(keep_fields)
    if fmt is GrpoFormat.chat:
        fixed = {"the chat record's key": "messages", "its other key": "task_name"}
        _check_keys({**fixed, "--reward-key": reward_key})
    else:
        _check_keys({"--input-key": input_key, "--output-key": output_key, "--reward-key": reward_key})

    def convert(record: dict[str, Any]) -> dict[str, Any]:
        if fmt is GrpoFormat.chat:
            return to_grpo_chat(
                record, task_name=task_name, reward_key=reward_key, keep_fields=kept, prompt_only=prompt_only,
                default_reward=missing_reward,
            )  # fmt: skip
        return to_grpo(
            record, input_key=input_key, output_key=output_key, reward_key=reward_key, keep_fields=kept,
            default_reward=missing_reward,
        )  # fmt: skip

    check = check_scored_rollout if missing_reward is None else check_rollout
    convert_filtered = _reward_filtered(convert, min_reward, max_reward, missing_reward)
    _run(rollouts, output, strict, run_records, convert_filtered, check=check)


@app.command()
def sft(
    rollouts: InPath,
    output: OutPath,
    min_reward: Annotated[
        float, typer.Option(help="Keep rollouts with reward >= this.", callback=_number)
    ] = 1.0,
    max_reward: Annotated[
        float | None, typer.Option(help="Keep rollouts with reward <= this.", callback=_number)
    ] = None,
    tools: Annotated[bool, typer.Option(help="Add the request's tools (chat-template form).")] = True,
    keep_cut_off: KeepCutOff = False,
    strict: Strict = False,
) -> None:
    """Successful rollouts -> chat SFT records {messages[, tools]} with tool calls and tool results."""

    def convert(record: dict[str, Any]) -> dict[str, Any] | None:
        if is_cut_off(record) and not keep_cut_off:
            return None  # filtered: a demonstration that stops mid-answer teaches stopping there
        return to_sft(record, include_tools=tools)

    _run(
        rollouts, output, strict, run_records, _reward_filtered(convert, min_reward, max_reward),
        check=check_scored_rollout,
    )  # fmt: skip


@app.command()
def dpo(
    rollouts: InPath,
    output: OutPath,
    all_pairs: Annotated[
        bool, typer.Option(help="Pair every rollout with every lower-rewarded one.")
    ] = False,
    min_margin: Annotated[
        float, typer.Option(help="Least reward gap between chosen and rejected.", callback=_number)
    ] = 0.0,
    fmt: Annotated[
        PairFormat, typer.Option("--format", help="text: prompt/response strings; chat: message lists.")
    ] = PairFormat.text,
    spill_dir: Annotated[Path | None, typer.Option(help="Where to group an unordered input on disk.")] = None,
    keep_cut_off: KeepCutOff = False,
    strict: Strict = False,
) -> None:
    """Per task: best vs worst rollout (or all pairs) -> {prompt, chosen, rejected, *_reward}; ties give no pair.

    Nor does a pair whose chosen and rejected read the same (in --format text, tool-using rollouts that
    differ only in their calls): use --format chat for those."""

    def convert(group: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return dpo_pairs(
            group, all_pairs=all_pairs, min_margin=min_margin, chat=fmt is PairFormat.chat,
            chosen_cut_off=keep_cut_off, drop_equal=True,
        )  # fmt: skip

    _run(rollouts, output, strict, run_grouped, convert, spill_dir=spill_dir, check=check_scored_rollout)


@app.command()
def ranked(
    rollouts: InPath,
    output: OutPath,
    fmt: Annotated[
        PairFormat, typer.Option("--format", help="text: prompt/response strings; chat: message lists.")
    ] = PairFormat.text,
    min_group_size: Annotated[int, typer.Option(min=1, help="Leave out tasks with fewer rollouts.")] = 1,
    spill_dir: Annotated[Path | None, typer.Option(help="Where to group an unordered input on disk.")] = None,
    strict: Strict = False,
) -> None:
    """Per task: rollouts ranked by reward -> {prompt, group: [{response, rank, reward}]}; equal rewards share a rank."""

    def convert(group: list[dict[str, Any]]) -> dict[str, Any] | None:
        if len(group) < min_group_size:
            return None
        return to_ranked(group, chat=fmt is PairFormat.chat)

    _run(rollouts, output, strict, run_grouped, convert, spill_dir=spill_dir, check=check_scored_rollout)


@app.command("ranked-to-grpo")
def ranked_to_grpo_command(
    ranked_groups: InPath,
    output: OutPath,
    input_key: InputKey = "input",
    output_key: OutputKey = "output",
    reward_key: RewardKey = "reward",
    strict: Strict = False,
) -> None:
    """Ranked groups -> GRPO records with reward (worst - rank) / (worst - best): 1.0 for the best, 0.0 for the worst.

    A group without an order (every member at one rank) gives none."""

    _check_keys({"--input-key": input_key, "--output-key": output_key, "--reward-key": reward_key})

    def convert(record: dict[str, Any]) -> list[dict[str, Any]]:
        return ranked_to_grpo(record, input_key=input_key, output_key=output_key, reward_key=reward_key)

    _run(ranked_groups, output, strict, run_records, convert, check=check_ranked)
