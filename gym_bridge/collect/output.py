"""The run's files on disk: the rollouts file and its side files, written so nothing is lost, and read
back to resume.

Each finished rollout is one complete, flushed line. ``resume`` cuts a torn last line, reads which
(task, repeat) pairs are done and runs exactly the others, failed ones included. Beside ``OUT`` go
``<stem>_failures.jsonl``, ``<stem>_metrics.json`` and NeMo Gym's ``<stem>_materialized_inputs.jsonl`` and
``<stem>_aggregate_metrics.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gym_bridge.collect.config import CollectError
from gym_bridge.records.file_lock import FlockUnsupported, HeldLock, LockBusy, acquire
from gym_bridge.records.jsonl import JsonlWriter, WriteFailed, iter_jsonl, plain_json, repair_torn_tail
from gym_bridge.records.nemo_gym_record import agent_name_for, environment_server_for, nemo_gym_record

__all__ = [
    "AGENT_LOOP_RESULT",
    "ENV_SERVER",
    "FAILURE_CLASS",
    "RESULT_TYPE",
    "ROLLOUT_INDEX",
    "TASK_INDEX",
    "LazyWriter",
    "OutputWriter",
    "aggregate_metrics_path_for",
    "failures_path_for",
    "keyed_records",
    "materialized_path_for",
    "metrics_path_for",
    "check_apart",
    "nemo_gym_agent_ref",
    "output_lock",
    "output_record",
    "prepare_output",
    "read_keys",
    "side_files",
    "slim_record",
    "stamps",
    "write_json",
]

TASK_INDEX = "_ng_task_index"
ROLLOUT_INDEX = "_ng_rollout_index"
FAILURE_CLASS = "_ng_failure_class"
ENV_SERVER = "_ng_environment_server"
RESULT_TYPE = "_ng_result_type"
AGENT_LOOP_RESULT = "legacy_agent"
"""NeMo Gym's ``_ng_result_type`` for a verify response made by an agent loop (its ``legacy_agent`` server)."""


def nemo_gym_agent_ref(row: dict[str, Any], env_name: str) -> dict[str, Any]:
    """The row's ``agent_ref``, or NeMo Gym's for the env it ran against (``<env>_simple_agent``)."""
    ref = row.get("agent_ref")
    return ref if isinstance(ref, dict) else {"name": agent_name_for(env_name)}


def stamps(task_index: int, rollout_index: int, agent_ref: dict[str, Any], env_name: str) -> dict[str, Any]:
    """What NeMo Gym stamps on a finished rollout, in its order: indices, ``agent_ref``, environment server
    (named after the agent, as NeMo Gym names it) and result type."""
    agent = agent_ref.get("name")
    return {
        TASK_INDEX: task_index,
        ROLLOUT_INDEX: rollout_index,
        "agent_ref": agent_ref,
        ENV_SERVER: environment_server_for(agent if isinstance(agent, str) else agent_name_for(env_name)),
        RESULT_TYPE: AGENT_LOOP_RESULT,
    }


def output_record(
    answer: dict[str, Any], row: dict[str, Any], task_index: int, rollout_index: int, env_name: str
) -> dict[str, Any]:
    """The env's ``/verify`` answer for ``row`` as NeMo Gym writes the rollout (:mod:`gym_bridge.records.nemo_gym_record`)."""
    params = row.get("responses_create_params")
    model = params.get("model") if isinstance(params, dict) else None
    marks = stamps(task_index, rollout_index, nemo_gym_agent_ref(row, env_name), env_name)
    return nemo_gym_record(answer, stamps=marks, model=model)


def failures_path_for(output: Path) -> Path:
    """``rollouts.jsonl`` -> ``rollouts_failures.jsonl``."""
    return output.with_name(output.stem + "_failures.jsonl")


def metrics_path_for(output: Path) -> Path:
    """``rollouts.jsonl`` -> ``rollouts_metrics.json``."""
    return output.with_name(output.stem + "_metrics.json")


def materialized_path_for(output: Path) -> Path:
    """NeMo Gym's name: ``rollouts.jsonl`` -> ``rollouts_materialized_inputs.jsonl``."""
    return output.with_name(output.stem + "_materialized_inputs.jsonl")


def aggregate_metrics_path_for(output: Path) -> Path:
    """NeMo Gym's name: ``rollouts.jsonl`` -> ``rollouts_aggregate_metrics.json``."""
    return output.with_name(output.stem + "_aggregate_metrics.json")


def side_files(out: Path) -> tuple[Path, ...]:
    """Every file a run writes beside ``out`` (``--overwrite`` clears them all)."""
    return (failures_path_for(out), metrics_path_for(out), materialized_path_for(out), aggregate_metrics_path_for(out))


def prepare_output(out: Path, resume: bool, overwrite: bool, side_files: tuple[Path, ...]) -> None:
    """Refuse to clobber a finished output unless told to resume or overwrite (which clears its side files)."""
    if out.exists() and out.is_dir():
        raise CollectError(f"{out} is a directory; give a .jsonl file path with -o")
    if resume and overwrite:
        raise CollectError("--resume and --overwrite contradict each other; pick one")
    nonempty = out.exists() and out.stat().st_size > 0
    if nonempty and not (resume or overwrite):
        raise CollectError(
            f"{out} already holds rollouts; use --resume to finish that run or --overwrite to replace it"
        )
    if overwrite:
        for p in (out, *side_files):
            p.unlink(missing_ok=True)


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (a link or another spelling too); for a path not there yet, whether
    they resolve alike."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def check_apart(read: Path, flag: str, written: tuple[Path, ...]) -> None:
    """Refuse a run that would write the file it reads (``read``, given as ``flag``): its output is cut
    (``--overwrite``), cleared (a side file) or appended to while it is read (``--resume`` read its own
    rollouts back as tasks, without end)."""
    for path in written:
        if same_file(read, path):
            raise CollectError(
                f"{flag} {read} is also a file this run writes ({path}); it would be overwritten or appended "
                "to while it is read: give -o another name"
            )


_HELD: dict[str, int] = {}
"""Locks this process holds, by lock file (``--ray`` takes it before :func:`collect` takes it again)."""


@contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``out`` while a run writes it, so that a second run on the same file
    (two collects, a ``--resume`` started twice, a reverify) is refused instead of writing each rollout
    twice. The lock is ``flock`` on a hidden ``.<name>.lock`` beside ``out``, removed at the end (a process
    that dies drops its lock with it). Where the file system has no ``flock`` the run goes unlocked."""
    lock = out.parent / f".{out.name}.lock"
    key = str(lock.resolve())
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    try:
        held: HeldLock | None = acquire(lock)
    except LockBusy:
        raise CollectError(
            f"{out} is being written by another run (a collect or reverify on the same -o, still going; "
            f"its lock is {lock}): wait for it to end, or give -o another name"
        ) from None
    except FlockUnsupported:  # a file system without flock (some network mounts): unlocked, as before
        held = None
    except OSError as e:
        raise CollectError(f"cannot write {out}: {e.strerror or e}") from None
    if held is None:
        yield
        return
    _HELD[key] = 1
    try:
        yield
    finally:
        del _HELD[key]
        held.release()


class OutputWriter(JsonlWriter):
    """The run's output file, appended to. Before its first new line, ``summaries`` (the files that
    summarise the output as it was, written at a run's end: ``_metrics.json``, ``_aggregate_metrics.json``)
    are removed, so a resumed run killed before its end leaves none, rather than an earlier run's figures
    beside more lines."""

    def __init__(self, path: Path, summaries: tuple[Path, ...]) -> None:
        super().__init__(path, append=True)
        self.summaries = summaries

    def write_line(self, text: str) -> None:
        summaries, self.summaries = self.summaries, ()
        for summary in summaries:
            try:
                if summary.is_file():  # (anything else there fails the end-of-run write, named)
                    summary.unlink()
            except OSError as e:
                raise WriteFailed(e.errno, f"cannot write {summary}: {e.strerror or e}", str(summary)) from e
        super().write_line(text)


class LazyWriter:
    """A JSONL writer that creates its file only when the first line comes (no empty failure files)."""

    def __init__(self, path: Path, append: bool) -> None:
        self.path, self.append, self.writer = path, append, None
        if not append and path.exists():
            path.unlink()

    def write(self, obj: dict[str, Any]) -> None:
        if self.writer is None:
            if self.append:
                repair_torn_tail(self.path)
            self.writer = JsonlWriter(self.path, append=True)
        self.writer.write(obj)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def write_json(path: Path, obj: Any, flat_below: int | None = None) -> None:
    """Write ``obj`` as indented JSON through a temp file, so a reader never sees half a file.

    ``flat_below``: values nested deeper than that many levels are written on one line each (an aggregate
    file's per-task metrics: one task a line). Why: ``json.dumps`` indents in pure Python, and indenting a
    run's ``_aggregate_metrics.json`` cost four times its compact encoding (~40k instructions a rollout).
    """
    tmp = path.with_suffix(".json.tmp")
    text = json.dumps(obj, indent=2, default=str) if flat_below is None else _indented(obj, flat_below, "")
    try:
        tmp.write_text(text + "\n")
        os.replace(tmp, path)
    except OSError as e:  # a full disk at the end of a run: named as a failed line write is
        tmp.unlink(missing_ok=True)
        raise WriteFailed(e.errno, f"cannot write {path}: {e.strerror or e}", str(path)) from e


def _indented(obj: Any, levels: int, indent: str) -> str:
    """``obj`` indented by two spaces a level for ``levels`` levels, compact (C-encoded) below."""
    if levels <= 0 or not obj or not isinstance(obj, dict | list):
        return plain_json(obj)
    if isinstance(obj, dict) and not all(isinstance(k, str) for k in obj):
        return json.dumps(obj, indent=2, default=str).replace("\n", "\n" + indent)  # keys JSON must convert
    inner = indent + "  "
    below = plain_json if levels == 1 else lambda value: _indented(value, levels - 1, inner)
    if isinstance(obj, dict):
        items = [f"{inner}{plain_json(k)}: {below(v)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    items = [inner + below(v) for v in obj]
    return "[\n" + ",\n".join(items) + "\n" + indent + "]"


def slim_record(record: dict[str, Any]) -> dict[str, Any]:
    """The fields the end-of-run metrics need, so a long run does not keep whole rollouts in memory."""
    keep = {
        k: record[k]
        for k in (TASK_INDEX, ROLLOUT_INDEX, "reward", "reward_components", "extracted_answer", "failure_kind", "mask_sample")
        if k in record
    }
    usage = (record.get("response") or {}).get("usage") if isinstance(record.get("response"), dict) else None
    if usage:
        keep["response"] = {"usage": usage}
    return keep


def keyed_records(
    path: Path, warn: Callable[[str], None]
) -> Iterator[tuple[int, tuple[int, int] | None, dict[str, Any]]]:
    """``(line, (task, repeat) or None, record)`` of a JSONL file of rows or rollouts, after cutting a torn tail."""
    cut = repair_torn_tail(path)
    if cut:
        warn(f"{path}: removed a torn last line ({cut} bytes) left by an interrupted run")
    if not path.exists():
        return
    for lineno, record in iter_jsonl(path, strict=False, on_error=lambda e: warn(f"{e}; ignored")):
        key = (record.get(TASK_INDEX), record.get(ROLLOUT_INDEX))
        ok = all(isinstance(x, int) and not isinstance(x, bool) for x in key)
        yield lineno, (key if ok else None), record  # type: ignore[misc]


def read_keys(path: Path, warn: Callable[[str], None]) -> set[tuple[int, int]]:
    """The (task, repeat) pairs of a JSONL file of rows or rollouts."""
    return {key for _, key, _ in keyed_records(path, warn) if key is not None}
