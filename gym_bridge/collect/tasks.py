"""Reading the task file: good rows streamed with their NeMo Gym task index, bad rows reported.

``_ng_task_index`` is the row's index in the file (0-based, counting every non-blank line, bad ones too,
so indices stay stable when a bad row is fixed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gym_bridge.records.jsonl import JsonlError, iter_jsonl
from gym_bridge.records.schema import TaskRow

__all__ = ["count_rows", "iter_tasks", "row_problem"]


def row_problem(obj: dict[str, Any]) -> str | None:
    """Why a JSON object is not a usable task row, or None."""
    if "responses_create_params" not in obj:
        return "not a task row: 'responses_create_params' is missing"
    try:
        TaskRow.model_validate(obj)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first.get("loc", ())) or "row"
        more = f" (+{e.error_count() - 1} more)" if e.error_count() > 1 else ""
        return f"not a task row: {loc}: {first.get('msg')}{more}"
    return None


def iter_tasks(
    path: Path,
    *,
    limit: int | None = None,
    strict: bool = False,
    on_bad: Callable[[int, JsonlError], None] | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Stream ``(task_index, row)`` for the good rows; bad rows go to ``on_bad`` (or raise with ``strict``)."""
    index = 0

    def bad_line(err: JsonlError) -> None:
        nonlocal index
        if limit is None or index < limit:
            if on_bad is not None:
                on_bad(index, err)
        index += 1

    for lineno, obj in iter_jsonl(path, strict=strict, on_error=bad_line):
        if limit is not None and index >= limit:
            return
        problem = row_problem(obj)
        if problem is not None:
            err = JsonlError(path, lineno, problem)
            if strict:
                raise err
            bad_line(err)
            continue
        yield index, obj
        index += 1


def count_rows(path: Path) -> int:
    """Lines in a file (fast, for the progress bar's total; blank lines are counted too)."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")
