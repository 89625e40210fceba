"""Run a transform over a JSONL file: stream in, convert, write out atomically, count what happened.

Output is all or nothing: records go to a temporary file beside ``OUT`` that is renamed onto it only when
the run succeeds, so a failed or interrupted run (``--strict`` on a bad line, Ctrl-C, a full disk) leaves
no half-written file and an existing ``OUT`` untouched.

Bad input (not JSON, not UTF-8, a missing field, a record of a shape a conversion cannot read) is
reported with ``file:line``; it is skipped and counted, or with ``strict`` it stops the run with
:class:`gym_bridge.records.jsonl.JsonlError`. One odd record never ends a run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym_bridge.records.jsonl import JsonlError, JsonlWriter, ReadStats
from transforms.common import RecordError, check_rollout, iter_rollouts
from transforms.grouping import NotContiguous, iter_contiguous_groups, iter_groups_on_disk

__all__ = ["EmptyOutput", "TransformReport", "atomic_writer", "run_grouped", "run_records"]

Converted = dict[str, Any] | list[dict[str, Any]] | None
ErrorSink = Callable[[JsonlError], None]

_UNUSABLE = (RecordError, AttributeError, TypeError, KeyError, IndexError, ValueError)
"""What a conversion raises on a record of a shape no check foresaw: that record is reported and skipped."""


@dataclass
class TransformReport:
    """End-of-run counts. ``filtered`` counts records for per-record transforms, tasks for grouped ones."""

    output: Path
    read: int = 0
    written: int = 0
    skipped: int = 0
    filtered: int = 0
    groups: int | None = None
    duplicates: int = 0
    """Grouped runs: records equal to one already in their task's group, left out (one file joined twice
    had given each rollout twice the weight in a ranked group)."""
    note: str | None = None


class EmptyOutput(ValueError):
    """A run (with ``allow_empty=False``) that would write no record: nothing is written, an existing
    output stays as it was. ``report`` says why: no usable record read, or every one filtered out."""

    def __init__(self, report: TransformReport, in_path: Path) -> None:
        self.report = report
        if report.read == 0:
            why = f"no usable record in {in_path}" + (f" ({report.skipped} bad lines skipped)" if report.skipped else " (it is empty)")
        else:
            unit = "tasks" if report.groups is not None else "records"
            why = f"all {report.filtered} {unit} of {in_path} were filtered out"
        super().__init__(f"{why}; nothing to write to {report.output}")


def _check_written(report: TransformReport, in_path: Path, allow_empty: bool) -> None:
    if not allow_empty and report.written == 0:
        raise EmptyOutput(report, in_path)  # inside the writer's block: the temp file is dropped


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str]) -> Iterator[JsonlWriter]:
    """A JSONL writer on a temp file that replaces ``path`` only if the block finishes without error."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    writer = JsonlWriter(tmp, append=False)
    try:
        yield writer
        writer.close()
        os.replace(tmp, final)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise


def _as_list(converted: Converted) -> list[dict[str, Any]]:
    if converted is None:
        return []
    return converted if isinstance(converted, list) else [converted]


def _convert_or_report(
    convert: Callable[[Any], Converted],
    arg: Any,
    path: Path,
    lineno: int,
    strict: bool,
    on_error: ErrorSink | None,
) -> Converted | RecordError:
    try:
        return convert(arg)
    except _UNUSABLE as e:
        if not isinstance(e, RecordError):
            e = RecordError(f"unusable record ({type(e).__name__}: {e})")
        err = JsonlError(path, lineno, str(e))
        if strict:
            raise err from None
        if on_error is not None:
            on_error(err)
        return e


def run_records(
    in_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    convert: Callable[[dict[str, Any]], Converted],
    *,
    strict: bool = False,
    on_error: ErrorSink | None = None,
    check: Callable[[dict[str, Any]], Any] = check_rollout,
    allow_empty: bool = True,
) -> TransformReport:
    """Stream ``in_path`` through ``convert`` (one record in; a record, a list, or None = filtered out).
    ``allow_empty=False``: a run that writes no record raises :class:`EmptyOutput` instead."""
    path = Path(in_path)
    report = TransformReport(output=Path(out_path))
    stats = ReadStats()
    with atomic_writer(out_path) as writer:
        for lineno, record in iter_rollouts(path, strict=strict, on_error=on_error, stats=stats, check=check):
            converted = _convert_or_report(convert, record, path, lineno, strict, on_error)
            if isinstance(converted, RecordError):
                report.skipped += 1
                stats.read -= 1
                continue
            outputs = _as_list(converted)
            if not outputs:
                report.filtered += 1
            for out in outputs:
                writer.write(out)
        report.written = writer.count
        report.read = stats.read
        report.skipped += stats.skipped
        _check_written(report, path, allow_empty)
    return report


class _ReportOnce:
    """Forward each bad line once, even when a restarted pass meets it again."""

    def __init__(self, sink: ErrorSink | None) -> None:
        self._sink = sink
        self._last_line = 0

    def __call__(self, err: JsonlError) -> None:
        if err.lineno > self._last_line:
            self._last_line = err.lineno
            if self._sink is not None:
                self._sink(err)


def _scalar(value: Any) -> Any:
    return value if isinstance(value, str | int | float) else None


def _distinct(group: list[tuple[int, dict[str, Any]]]) -> list[tuple[int, dict[str, Any]]]:
    """The group without records equal (as JSON values) to an earlier member. Only records that share
    their rollout index, reward and response id are compared (a copy shares all three)."""
    seen: dict[tuple[Any, Any, Any], list[dict[str, Any]]] = {}
    kept = []
    for lineno, record in group:
        response = record.get("response")
        response_id = response.get("id") if isinstance(response, dict) else None
        alike = seen.setdefault(
            (_scalar(record.get("_ng_rollout_index")), _scalar(record.get("reward")), _scalar(response_id)), []
        )
        if any(record == other for other in alike):
            continue
        alike.append(record)
        kept.append((lineno, record))
    return kept


def _write_groups(
    groups: Iterable[list[tuple[int, dict[str, Any]]]],
    out_path: str | os.PathLike[str],
    convert_group: Callable[[list[dict[str, Any]]], Converted],
    stats: ReadStats,
    path: Path,
    strict: bool,
    on_error: ErrorSink | None,
    allow_empty: bool = True,
) -> TransformReport:
    report = TransformReport(output=Path(out_path), groups=0)
    failed = 0
    with atomic_writer(out_path) as writer:
        for whole in groups:
            report.groups = (report.groups or 0) + 1
            group = _distinct(whole)
            report.duplicates += len(whole) - len(group)
            records = [record for _, record in group]
            converted = _convert_or_report(convert_group, records, path, group[0][0], strict, on_error)
            if isinstance(converted, RecordError):
                failed += len(group)
                continue
            outputs = _as_list(converted)
            if not outputs:
                report.filtered += 1
            for out in outputs:
                writer.write(out)
        report.written = writer.count
        report.read = stats.read - failed
        report.skipped = stats.skipped + failed
        _check_written(report, path, allow_empty)
    return report


def run_grouped(
    in_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    convert_group: Callable[[list[dict[str, Any]]], Converted],
    *,
    strict: bool = False,
    on_error: ErrorSink | None = None,
    spill_dir: str | os.PathLike[str] | None = None,
    allow_empty: bool = True,
    check: Callable[[dict[str, Any]], Any] = check_rollout,
) -> TransformReport:
    """Run ``convert_group`` on each task's distinct rollouts (a record equal to one already in its group is
    left out and counted in ``duplicates``): streaming when the file is in task order, else on disk.

    A file found out of order part-way is read again from the start (the partial output is discarded).
    ``allow_empty=False``: a run that writes no record raises :class:`EmptyOutput` instead. ``check``: what a
    record must pass to be read (others are bad lines).
    """
    path = Path(in_path)
    once = _ReportOnce(on_error)
    stats = ReadStats()
    records = iter_rollouts(path, strict=strict, on_error=once, stats=stats, check=check)
    try:
        return _write_groups(
            iter_contiguous_groups(records), out_path, convert_group, stats, path, strict, once, allow_empty
        )
    except NotContiguous as e:
        note = f"input not in task order (line {e.lineno}); grouped through a temporary file on disk"
    stats = ReadStats()
    records = iter_rollouts(path, strict=strict, on_error=once, stats=stats, check=check)
    report = _write_groups(
        iter_groups_on_disk(records, spill_dir), out_path, convert_group, stats, path, strict, once, allow_empty
    )
    report.note = note
    return report
