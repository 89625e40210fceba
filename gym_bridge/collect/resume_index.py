"""Which (task, repeat) pairs a run has already done, in a bit each, read from its files as a stream.

Why: ``--resume`` kept a Python set of tuples (about 150 bytes a rollout) and every earlier record
slimmed (about 1 KB) to summarise the run at the end; a run of a million rollouts resumed with gigabytes.
Here a pair is one bit of a bitmap (task x repeats + repeat), and each earlier record is handed to the
caller once (its metrics are counted as it goes by) instead of being kept.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gym_bridge.collect.config import CollectError
from gym_bridge.collect.output import ENV_SERVER, ROLLOUT_INDEX, TASK_INDEX, keyed_records
from gym_bridge.records.jsonl import compact_json

__all__ = ["PairSet", "RowPrints", "first_difference", "read_done", "read_materialized", "row_print"]


class PairSet:
    """A set of non-negative ``(task, repeat)`` pairs: one bit each for ``repeat < stride``, a plain set beyond."""

    def __init__(self, stride: int) -> None:
        self.stride = max(1, stride)
        self.bits = bytearray()
        self.others: set[tuple[int, int]] = set()
        self.count = 0
        self.largest_repeat = -1

    def _where(self, key: tuple[int, int]) -> tuple[int, int] | None:
        task, repeat = key
        if task < 0 or repeat < 0 or repeat >= self.stride:
            return None
        i = task * self.stride + repeat
        return i >> 3, 1 << (i & 7)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        where = self._where(key)  # type: ignore[arg-type]
        if where is None:
            return key in self.others
        byte, bit = where
        return byte < len(self.bits) and bool(self.bits[byte] & bit)

    def add(self, key: tuple[int, int]) -> None:
        if key in self:
            return
        where = self._where(key)
        if where is None:
            self.others.add(key)
        else:
            byte, bit = where
            if byte >= len(self.bits):
                self.bits.extend(bytes(max(byte + 1 - len(self.bits), len(self.bits))))  # doubles: amortized
            self.bits[byte] |= bit
        self.count += 1
        self.largest_repeat = max(self.largest_repeat, key[1])

    def __len__(self) -> int:
        return self.count

    def count_below(self, tasks: int) -> int:
        """Pairs with ``task < tasks`` and ``repeat < stride``."""
        end = max(0, tasks) * self.stride
        whole = int.from_bytes(self.bits[: end >> 3], "little").bit_count()
        if end & 7 and (end >> 3) < len(self.bits):
            whole += (self.bits[end >> 3] & ((1 << (end & 7)) - 1)).bit_count()
        return whole


_ROUTING = frozenset({"agent_ref", ENV_SERVER})
"""Stamps that follow the ``--env`` a row is routed to (a bare URL's port), not the row or its request."""


def row_print(row: dict[str, Any]) -> int:
    """A fingerprint of a (task, repeat) as run (its materialized inputs row): the task row and its request
    with the run's overrides and seed, without the routing stamps (keys sorted: their order is no change)."""
    kept = {k: v for k, v in row.items() if k not in _ROUTING}
    return hash(json.dumps(kept, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str))


_ABSENT: Any = object()


def first_difference(old: Any, new: Any, where: str = "") -> str:
    """Where two JSON values first differ, as ``a.b: OLD -> NEW`` (for a message)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in [*old, *(k for k in new if k not in old)]:
            if key in _ROUTING and not where:
                continue
            if old.get(key, _ABSENT) != new.get(key, _ABSENT):
                inner = f"{where}.{key}" if where else str(key)
                return first_difference(old.get(key, _ABSENT), new.get(key, _ABSENT), inner)
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            if a != b:
                return first_difference(a, b, f"{where}[{i}]")
    shown = ["(not set)" if v is _ABSENT else compact_json(v)[:80] for v in (old, new)]
    return f"{where or 'row'}: {shown[0]} -> {shown[1]}"


class RowPrints:
    """For each task an earlier run made, one of its repeats and :func:`row_print` of it, in 12 bytes a
    task: enough to tell, on ``--resume``, that the task file or the request settings changed."""

    def __init__(self) -> None:
        self.repeats = array("i")
        self.prints = array("q")

    def add(self, task: int, repeat: int, fingerprint: int) -> None:
        if task < 0:
            return
        if task >= len(self.repeats):
            grow = max(task + 1 - len(self.repeats), len(self.repeats))  # doubles: amortized
            self.repeats.extend(array("i", [-1]) * grow)
            self.prints.extend(array("q", [0]) * grow)
        if self.repeats[task] < 0:
            self.repeats[task] = repeat
            self.prints[task] = fingerprint

    def get(self, task: int) -> tuple[int, int] | None:
        """``(repeat, fingerprint)`` recorded for ``task``, or None."""
        if task < len(self.repeats) and self.repeats[task] >= 0:
            return self.repeats[task], self.prints[task]
        return None


def _past_the_end(path: Path, lineno: int, task: int, tasks: int | None) -> None:
    """Refuse a record of a task the task file does not have (it holds ``tasks`` lines)."""
    if tasks is not None and task >= tasks:
        raise CollectError(
            f"{path}:{lineno}: a record of task {task}, but the task file has only {tasks} lines: --resume "
            "continues a run over the same task file; restore it, or write to a new -o"
        )


def read_done(
    output: Path,
    warn: Callable[[str], None],
    stride: int,
    on_record: Callable[[dict[str, Any]], None],
    tasks: int | None = None,
) -> PairSet:
    """The (task, repeat) pairs already in ``output`` (after cutting a torn tail); ``on_record`` sees each
    one's record once, in file order (a duplicate is warned of and counted once, as before). ``tasks``:
    the task file's line count; a record of a task past it is kept and counted but is no pair of this run
    (a damaged index such as 10**12 once made the bitmap ask for terabytes)."""
    done = PairSet(stride)
    for lineno, key, record in keyed_records(output, warn):
        if key is None:
            warn(f"{output}:{lineno}: no {TASK_INDEX}/{ROLLOUT_INDEX}; ignored for resuming")
            continue
        if tasks is not None and key[0] >= tasks:
            warn(f"{output}:{lineno}: a rollout of task {key[0]}, past the task file's {tasks} lines; kept as it is")
            on_record(record)
            continue
        if key in done:
            warn(f"{output}:{lineno}: duplicate rollout {key}; counted once")
            continue
        done.add(key)
        on_record(record)
    return done


def read_materialized(
    path: Path, warn: Callable[[str], None], stride: int, tasks: int | None = None
) -> tuple[PairSet, RowPrints]:
    """The (task, repeat) pairs of NeMo Gym's materialized inputs file, and :class:`RowPrints` of its rows
    (a row of a task past the task file's ``tasks`` lines is refused, as in :func:`read_done`)."""
    pairs, prints = PairSet(stride), RowPrints()
    for lineno, key, row in keyed_records(path, warn):
        if key is not None:
            _past_the_end(path, lineno, key[0], tasks)
            pairs.add(key)
            prints.add(key[0], key[1], row_print(row))
    return pairs, prints
