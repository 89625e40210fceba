"""``/aggregate_metrics`` as NeMo Gym speaks it: its request body in, its ``AggregateMetrics`` shape out.

NeMo Gym's collector (``nemo_gym/rollout_collection.py``) posts ``{"verify_responses": [...]}`` with each
record stripped of ``responses_create_params`` and of ``response`` except ``response.usage`` and
``response.incomplete_details``; it reads the answer with its ``AggregateMetrics`` model::

    {"group_level_metrics": [per task], "agent_metrics": {...}, "key_metrics": {...},
     "repeat_level_metrics": [per repeat]}

Statistics follow NeMo Gym 0.7.0's ``RewardProfiler`` (``nemo_gym/reward_profile.py``), names and values:
``mean/X``, ``max/X``, ``min/X``, ``median/X``, ``std/X`` (sample standard deviation, 0 for one value) over
every numeric field X of the records (top-level numbers not starting with ``_`` and ``response.usage``
counts; booleans are not numbers there, so ``mask_sample`` is left out). Per task (``_ng_task_index``) in
``group_level_metrics``; per repeat (``_ng_rollout_index``, only when there are several) in
``repeat_level_metrics``, which adds ``sem/``, ``p25/``, ``p75/``; over all records in ``agent_metrics``,
which adds ``{mean,median,std,min,max,se}_across_repeats/mean/X`` (each repeat's mean as one observation)
and the environment's own summary (pass@1, pass@k, majority@k, failure kinds ...:
``ResourcesServer.aggregate_metrics``). ``key_metrics`` is NeMo Gym's default headline set (every ``mean/X``
of ``agent_metrics``) plus pass@k and majority@k. NeMo Gym's 95% confidence intervals (a Student-t
interval, scipy) are not computed. Each ``reward_components`` entry is one more field,
``reward_components.<name>`` (NeMo Gym's profiler skips nested objects, which is why its multi-reward
example repeats each component at the top level; here the components are described as they are), so
``mean/reward_components.<name>`` is among the headline figures.
"""

from __future__ import annotations

import json
import math
import operator
import statistics
import sys
import tempfile
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from typing import IO, Any

from gym_bridge.records.jsonl import compact_json, plain_json
from gym_bridge.records.schema import is_finite_number, reward_components_problem

__all__ = [
    "AggregateRequestError",
    "SpilledGroups",
    "StreamingAggregate",
    "nemo_gym_aggregate",
    "parse_aggregate_request",
    "strip_for_aggregation",
    "whole_and_stripped_json",
]


def _stdev(xs: list[float]) -> float:
    """Sample standard deviation (0 for one value, or for equal values), in floats as pandas computes it.

    Why not ``statistics.stdev``: it sums exactly in fractions, about a third of an ``/aggregate_metrics``
    answer's CPU (which collect asks for at the end of every run); NeMo Gym's figure is pandas' float one.
    """
    n = len(xs)
    if n < 2:
        return 0.0
    if xs.count(xs[0]) == n:
        return 0.0
    mean = math.fsum(xs) / n
    std = math.sqrt(math.fsum([(x - mean) * (x - mean) for x in xs]) / (n - 1))
    return std if math.isfinite(std) else statistics.stdev(xs)  # squares past the float range: exactly


TASK_INDEX = "_ng_task_index"
ROLLOUT_INDEX = "_ng_rollout_index"
COMPONENT_FIELD = "reward_components."
"""Prefix of a reward component's field name in the statistics (``mean/reward_components.correct``)."""
_STATS = ("mean", "max", "min", "median", "std")
"""What is reported of each field, in this order (per task, over all records)."""
_REPEAT_STATS = (*_STATS, "sem", "p25", "p75")
_ACROSS_REPEATS = (*_STATS, "se")


def _columns_stats(columns: list[Sequence[float]], quantiles: bool) -> dict[str, list[float]]:
    """Each statistic of every column (the values of one field in one group): ``statistics.fmean``,
    ``max``, ``min``, ``statistics.median``, :func:`_stdev`, the standard error (``sem``/``se``) and with
    ``quantiles`` ``p25``/``p75``, the same numbers those functions give.

    Why all columns at once: each statistic is one ``map`` of a C function over the columns instead of a
    call per column and statistic, which was most of an answer's CPU (every task is a group).
    """
    sizes = list(map(len, columns))
    ordered = list(map(sorted, columns))
    # _stdev's value; a column of equal values (most of a task's) is 0 without the call
    std = [0.0 if xs.count(xs[0]) == n else _stdev(xs) for xs, n in zip(columns, sizes, strict=True)]
    sem = [deviation / n**0.5 for deviation, n in zip(std, sizes, strict=True)]
    stats = {
        "mean": list(map(operator.truediv, map(math.fsum, columns), sizes)),
        "max": list(map(max, columns)),
        "min": list(map(min, columns)),
        "median": [
            xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
            for xs, n in zip(ordered, sizes, strict=True)
        ],
        "std": std,
        "sem": sem,
        "se": sem,
    }
    if quantiles:
        stats["p25"] = [_quantile(xs, 0.25) for xs in ordered]
        stats["p75"] = [_quantile(xs, 0.75) for xs in ordered]
    return stats


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between order statistics (pandas' default, which NeMo Gym uses) of sorted values."""
    pos = (len(ordered) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


class AggregateRequestError(ValueError):
    """A body that is not a list of verify responses; the message names the field."""


_HEAVY = (
    "response",
    "responses_create_params",
    "ng_agent_observations",
    "ng_model_call_capture",
    "ng_trajectory",
)
"""What NeMo Gym's collector leaves out of the records it sends to ``/aggregate_metrics``."""
_HEAVY_SET = frozenset(_HEAVY)


def strip_for_aggregation(record: dict[str, Any]) -> dict[str, Any]:
    """A record as NeMo Gym sends it to ``/aggregate_metrics``: no request, ``response`` cut to usage/incomplete_details."""
    entry = record.copy()  # then a pop per heavy field: cheaper than a comprehension over every field
    for key in _HEAVY:
        entry.pop(key, None)
    if kept := _kept_response(record):
        entry["response"] = kept
    return entry


def _kept_response(record: dict[str, Any]) -> dict[str, Any] | None:
    response = record.get("response")
    if not isinstance(response, dict):
        return None
    return {k: response[k] for k in ("usage", "incomplete_details") if response.get(k) is not None}


def whole_and_stripped_json(record: dict[str, Any]) -> tuple[str, str]:
    """``compact_json(record)`` and ``compact_json(strip_for_aggregation(record))``, the fields both hold
    encoded once.

    Why: collect writes each record and keeps it stripped for ``/aggregate_metrics``; encoding the
    stripped record again cost more than a tenth of a no-op rollout's instructions. The two texts are
    spliced from the encoded heavy fields and the encoded rest, which needs the heavy fields first (a
    verify answer's order: ``responses_create_params``, ``response``, then the rest); a record in another
    order is encoded twice.
    """
    keys = list(record)
    cut = 0
    while cut < len(keys) and keys[cut] in _HEAVY_SET:
        cut += 1
    if not _HEAVY_SET.isdisjoint(keys[cut:]):
        return compact_json(record), compact_json(strip_for_aggregation(record))
    if cut == 0:
        whole = compact_json(record)
        return whole, whole
    rest = compact_json({k: record[k] for k in keys[cut:]})  # "{...}", or "{}" when nothing follows
    heavy = compact_json({k: record[k] for k in keys[:cut]})
    whole = heavy[:-1] + "," + rest[1:] if len(keys) > cut else heavy
    kept = _kept_response(record)
    if not kept:
        return whole, rest
    return whole, rest[:-1] + ("," if len(keys) > cut else "") + '"response":' + compact_json(kept) + "}"


_FLOAT_INT = int(sys.float_info.max)
"""The largest integer magnitude :func:`_numeric_fields` takes (``float()`` raises on those that round past
the largest float, ~1.8e308)."""


def parse_aggregate_request(body: Any) -> list[dict[str, Any]]:
    """The records of an ``/aggregate_metrics`` body (NeMo Gym's ``{"verify_responses": [...]}`` or a bare list).

    Each record needs a numeric ``reward``; ``_ng_task_index``/``_ng_rollout_index``, when present, must
    be non-negative integers. The request and the response are optional, as NeMo Gym strips them, but objects when present.
    """
    records = body.get("verify_responses") if isinstance(body, dict) else body
    if not isinstance(records, list):
        raise AggregateRequestError("verify_responses: expected a list of verify responses")
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise AggregateRequestError(f"verify_responses.{i}: expected an object")
        if not is_finite_number(record.get("reward")):
            raise AggregateRequestError(f"verify_responses.{i}.reward: expected a finite number, got {record.get('reward')!r:.40}")
        components = record.get("reward_components")
        if components is not None and (problem := reward_components_problem(components)) is not None:
            raise AggregateRequestError(f"verify_responses.{i}.reward_components: {problem}")
        for key in ("response", "responses_create_params"):
            value = record.get(key)
            if value is not None and not isinstance(value, dict):
                raise AggregateRequestError(f"verify_responses.{i}.{key}: expected an object, got {type(value).__name__}")
        if (problem := _usage_problem(record.get("response"))) is not None:
            raise AggregateRequestError(f"verify_responses.{i}.response.usage{problem}")
        failure = record.get("failure_kind")
        if failure is not None and not isinstance(failure, str):
            raise AggregateRequestError(f"verify_responses.{i}.failure_kind: expected a string, got {type(failure).__name__}")
        for key in (TASK_INDEX, ROLLOUT_INDEX):
            value = record.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise AggregateRequestError(f"verify_responses.{i}.{key}: expected a non-negative integer, got {value!r}")
    return records


def _usage_problem(response: dict[str, Any] | None) -> str | None:
    """What is wrong with ``response.usage`` (an object whose token counts are non-negative integers, as
    NeMo Gym's ``ResponseUsage`` types them; the run's token totals add them up), after its name; None: fine."""
    usage = response.get("usage") if response is not None else None
    if usage is None:
        return None
    if not isinstance(usage, dict):
        return f": expected an object, got {type(usage).__name__}"
    for key in ("input_tokens", "output_tokens"):
        value = usage.get(key)
        if value is not None and (type(value) is not int or not 0 <= value <= _FLOAT_INT):
            return f".{key}: expected a non-negative integer, got {value!r:.40}"
    return None


def _numeric_fields(record: dict[str, Any]) -> dict[str, float]:
    """The numbers NeMo Gym's profiler describes: top-level (not ``_``-prefixed) and ``response.usage``;
    and each reward component, as ``reward_components.<name>``."""
    out: dict[str, float] = {}
    response = record.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    for source in (usage, record) if isinstance(usage, dict) else (record,):
        for key, value in source.items():
            kind = type(value)
            if kind is float or kind is int:  # (what JSON's numbers are, checked first)
                if (math.isfinite(value) if kind is float else -_FLOAT_INT <= value <= _FLOAT_INT) and (
                    not key.startswith("_") and key != "response"
                ):  # an integer too large for a float is left out, as a NaN is (pandas: not a numeric column)
                    out[key] = float(value)
            elif kind is not str and kind is not dict and kind is not list and value is not None:
                # not a bool: NeMo Gym's profiler takes pandas' numeric columns only
                if not key.startswith("_") and key != "response" and is_finite_number(value):
                    out[key] = float(value)
    components = record.get("reward_components")
    if isinstance(components, dict):
        out.update({COMPONENT_FIELD + name: float(value) for name, value in components.items()})
    return out


def _describe(
    groups: list[list[dict[str, float]]], names: tuple[str, ...] = _STATS, label: str = "{}/{}"
) -> list[dict[str, float]]:
    """For each group of rows, ``label.format(stat, field)`` -> the statistic, for each statistic in ``names``
    (the outer order) and each field the group's rows hold (in the order they first appear)."""
    columns: list[Sequence[float]] = []
    spans: list[tuple[int, tuple[str, ...]]] = []  # per group: where its columns start, its fields
    for rows in groups:
        shapes = set(map(tuple, rows))
        if len(shapes) == 1:  # every row has the same fields in the same order (the usual case)
            fields = shapes.pop()
            spans.append((len(columns), fields))
            columns += zip(*map(dict.values, rows), strict=True)
            continue
        by_field: dict[str, list[float]] = {}
        for row in rows:
            for field, value in row.items():
                column = by_field.get(field)
                if column is None:
                    by_field[field] = [value]
                else:
                    column.append(value)
        spans.append((len(columns), tuple(by_field)))
        columns += by_field.values()
    stats = _columns_stats(columns, quantiles="p25" in names)
    per_column = list(zip(*(stats[stat] for stat in names), strict=True))  # each column: its statistics
    described, labels = [], {}
    for start, fields in spans:
        if fields not in labels:
            labels[fields] = [label.format(stat, field) for stat in names for field in fields]
        by_stat = chain.from_iterable(zip(*per_column[start : start + len(fields)], strict=True))
        described.append(dict(zip(labels[fields], by_stat, strict=True)))
    return described


def _across_repeats(repeats: list[dict[str, Any]]) -> dict[str, float]:
    """NeMo Gym's ``<stat>_across_repeats/mean/X``: each repeat's ``mean/X`` taken as one observation."""
    means = [{key: value for key, value in entry.items() if key.startswith("mean/")} for entry in repeats]
    return _describe([means], _ACROSS_REPEATS, "{}_across_repeats/{}")[0]


def nemo_gym_aggregate(
    records: list[dict[str, Any]], summary: Callable[[list[dict[str, Any]]], dict[str, Any]]
) -> dict[str, Any]:
    """NeMo Gym's ``AggregateMetrics`` for ``records``; ``summary`` is the environment's own metrics (merged in)."""
    if not records:
        return {"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}, "repeat_level_metrics": []}
    numbers = [_numeric_fields(r) for r in records]
    by_task: dict[int, list[dict[str, float]]] = defaultdict(list)
    by_repeat: dict[int, list[tuple[int, dict[str, float]]]] = defaultdict(list)
    for record, row in zip(records, numbers, strict=True):
        task = record.get(TASK_INDEX) or 0
        by_task[task].append(row)
        by_repeat[record.get(ROLLOUT_INDEX) or 0].append((task, row))
    tasks = sorted(by_task.items())
    groups = [
        {TASK_INDEX: task, **described, "num_rollouts": len(rows)}
        for (task, rows), described in zip(tasks, _describe([rows for _, rows in tasks]), strict=True)
    ]
    repeats = []
    if len(by_repeat) > 1:
        per_repeat = sorted(by_repeat.items())
        described = _describe([[row for _, row in entries] for _, entries in per_repeat], _REPEAT_STATS)
        for (repeat, entries), stats in zip(per_repeat, described, strict=True):
            present = len({task for task, _ in entries})
            counts = {"sample_count": present, "missing_count": len(by_task) - present}
            repeats.append({ROLLOUT_INDEX: repeat, **counts, **stats})
    agent = {**_describe([numbers])[0], **_across_repeats(repeats), "num_repeats": len(by_repeat)}
    agent.update(summary(records))
    key = {name: value for name, value in agent.items() if name.startswith("mean/")}
    key.update({name: value for name, value in agent.items() if name.startswith(("pass@", "majority@"))})
    return {"group_level_metrics": groups, "agent_metrics": agent, "key_metrics": key, "repeat_level_metrics": repeats}


class StreamingAggregate:
    """:func:`nemo_gym_aggregate` fed one record at a time, holding one float per number rather than records.

    Why: a run of a million rollouts posted every record in one request and the answer came back with
    every task's figures, several gigabytes in memory on each side. Here each record's numbers go into
    one column per (repeat, field) (8 bytes a value, so medians and quantiles stay exact), a task's rows
    wait only until :meth:`close` (or ``group_size`` of them), and its ``group_level_metrics`` entry goes
    to a file, one line each; :meth:`result` gives the same answer, its groups read back from that file
    in task order (:class:`SpilledGroups`). Assumes each (task, repeat) comes once (collect's records).
    """

    BATCH = 512
    """Closed groups described together (one ``_describe`` call: its per-call cost spread)."""

    def __init__(self, group_size: int | None = None, directory: str | None = None) -> None:
        self.group_size = group_size
        self.open: dict[int, list[dict[str, float]]] = {}
        self.pending: list[tuple[int, list[dict[str, float]]]] = []
        self.columns: dict[int, dict[str, array[float]]] = {}  # repeat -> field -> values
        self.fields: dict[str, None] = {}  # every field, in the order first seen
        self.repeat_tasks: dict[int, int] = defaultdict(int)  # repeat -> records (one per task)
        self.tasks = 0
        self.groups = SpilledGroups(directory)

    def add(self, record: dict[str, Any]) -> None:
        row = _numeric_fields(record)
        task, repeat = record.get(TASK_INDEX) or 0, record.get(ROLLOUT_INDEX) or 0
        columns = self.columns.get(repeat)
        if columns is None:
            columns = self.columns[repeat] = {}
        for name, value in row.items():
            column = columns.get(name)
            if column is None:
                column = columns[name] = array("d")
                self.fields.setdefault(name)
            column.append(value)
        self.repeat_tasks[repeat] += 1
        rows = self.open.get(task)
        if rows is None:
            rows = self.open[task] = []
        rows.append(row)
        if self.group_size is not None and len(rows) >= self.group_size:
            self.close(task)

    def close(self, task: int) -> None:
        """Task ``task`` gets no more records: its group entry is described and written out."""
        rows = self.open.pop(task, None)
        if rows is not None:
            self.pending.append((task, rows))
            if len(self.pending) >= self.BATCH:
                self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        described = _describe([rows for _, rows in self.pending])
        for (task, rows), stats in zip(self.pending, described, strict=True):
            self.groups.add(task, {TASK_INDEX: task, **stats, "num_rollouts": len(rows)})
        self.tasks += len(self.pending)
        self.pending = []

    def result(self, summary: dict[str, Any]) -> dict[str, Any]:
        """The answer :func:`nemo_gym_aggregate` gives, ``summary`` being the environment's own metrics;
        its ``group_level_metrics`` is a :class:`SpilledGroups` (read from its file in task order)."""
        for task in sorted(self.open):
            self.close(task)
        self._flush()
        if not self.tasks:
            return {"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}, "repeat_level_metrics": []}
        repeats = []
        if len(self.columns) > 1:
            order = sorted(self.columns)
            described = _describe_columns([self.columns[r] for r in order], _REPEAT_STATS)
            for repeat, stats in zip(order, described, strict=True):
                present = self.repeat_tasks[repeat]
                counts = {"sample_count": present, "missing_count": self.tasks - present}
                repeats.append({ROLLOUT_INDEX: repeat, **counts, **stats})
        merged: dict[str, array[float]] = {name: array("d") for name in self.fields}
        for columns in self.columns.values():
            for name, column in columns.items():
                merged[name].extend(column)
        agent = {**_describe_columns([merged])[0], **_across_repeats(repeats), "num_repeats": len(self.columns)}
        agent.update(summary)
        key = {name: value for name, value in agent.items() if name.startswith("mean/")}
        key.update({name: value for name, value in agent.items() if name.startswith(("pass@", "majority@"))})
        return {"group_level_metrics": self.groups, "agent_metrics": agent, "key_metrics": key,
                "repeat_level_metrics": repeats}  # fmt: skip


def _describe_columns(
    groups: list[dict[str, Sequence[float]]], names: tuple[str, ...] = _STATS
) -> list[dict[str, float]]:
    """:func:`_describe` of groups given as columns (field -> its values) instead of rows."""
    out = []
    for group in groups:  # a column at a time: a sorted copy of a million values is 32 MB
        per_field = {field: _columns_stats([values], quantiles="p25" in names) for field, values in group.items()}
        out.append({f"{stat}/{field}": per_field[field][stat][0] for stat in names for field in group})
    return out


class SpilledGroups(Sequence[dict[str, Any]]):
    """``group_level_metrics`` kept in a temporary file, one JSON line per task, read back in task
    order (a run's tasks finish out of order). Compares equal to the list it stands for."""

    def __init__(self, directory: str | None = None) -> None:
        self.file: IO[bytes] | None = None
        self.directory = directory
        self.index: list[tuple[int, int, int]] = []  # (task, offset, length)

    def add(self, task: int, entry: dict[str, Any]) -> None:
        if self.file is None:
            self.file = tempfile.TemporaryFile(dir=self.directory, prefix=".aggregate-groups-")
        line = plain_json(entry).encode()  # as an aggregate file writes a task's line
        self.index.append((task, self.file.tell(), len(line)))
        self.file.write(line)

    def lines(self) -> Iterator[bytes]:
        """Each entry's compact JSON, in task order."""
        if self.file is None:
            return
        self.index.sort()
        for _, offset, length in self.index:
            self.file.seek(offset)
            yield self.file.read(length)
        self.file.seek(0, 2)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (json.loads(line) for line in self.lines())

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: Any) -> Any:
        return list(self)[i]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
