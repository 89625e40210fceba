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

import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from gym_bridge.schema import reward_components_problem

__all__ = ["AggregateRequestError", "nemo_gym_aggregate", "parse_aggregate_request", "strip_for_aggregation"]


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
_STATS: dict[str, Callable[[list[float]], float]] = {
    "mean": statistics.fmean,
    "max": max,
    "min": min,
    "median": statistics.median,
    "std": _stdev,
}
COMPONENT_FIELD = "reward_components."
"""Prefix of a reward component's field name in the statistics (``mean/reward_components.correct``)."""
_REPEAT_STATS: dict[str, Callable[[list[float]], float]] = {
    **_STATS,
    "sem": lambda xs: _STATS["std"](xs) / len(xs) ** 0.5,
    "p25": lambda xs: _quantile(xs, 0.25),
    "p75": lambda xs: _quantile(xs, 0.75),
}
_ACROSS_REPEATS: dict[str, Callable[[list[float]], float]] = {**_STATS, "se": _REPEAT_STATS["sem"]}


def _quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (pandas' default, which NeMo Gym uses)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(xs) - 1)
    return xs[low] + (xs[high] - xs[low]) * (pos - low)


class AggregateRequestError(ValueError):
    """A body that is not a list of verify responses; the message names the field."""


def strip_for_aggregation(record: dict[str, Any]) -> dict[str, Any]:
    """A record as NeMo Gym sends it to ``/aggregate_metrics``: no request, ``response`` cut to usage/incomplete_details."""
    heavy = ("response", "responses_create_params", "ng_agent_observations", "ng_model_call_capture", "ng_trajectory")
    entry = {k: v for k, v in record.items() if k not in heavy}
    response = record.get("response")
    if isinstance(response, dict):
        kept = {k: response[k] for k in ("usage", "incomplete_details") if response.get(k) is not None}
        if kept:
            entry["response"] = kept
    return entry


def _finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


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
        if not _finite_number(record.get("reward")):
            raise AggregateRequestError(f"verify_responses.{i}.reward: expected a finite number, got {record.get('reward')!r}")
        components = record.get("reward_components")
        if components is not None and (problem := reward_components_problem(components)) is not None:
            raise AggregateRequestError(f"verify_responses.{i}.reward_components: {problem}")
        for key in ("response", "responses_create_params"):
            value = record.get(key)
            if value is not None and not isinstance(value, dict):
                raise AggregateRequestError(f"verify_responses.{i}.{key}: expected an object, got {type(value).__name__}")
        for key in (TASK_INDEX, ROLLOUT_INDEX):
            value = record.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise AggregateRequestError(f"verify_responses.{i}.{key}: expected a non-negative integer, got {value!r}")
    return records


def _numeric_fields(record: dict[str, Any]) -> dict[str, float]:
    """The numbers NeMo Gym's profiler describes: top-level (not ``_``-prefixed) and ``response.usage``;
    and each reward component, as ``reward_components.<name>``."""
    out: dict[str, float] = {}
    response = record.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    sources = [usage if isinstance(usage, dict) else {}, record]
    for source in sources:
        for key, value in source.items():
            kind = type(value)
            if kind is str or kind is dict or kind is list or value is None or key.startswith("_") or key == "response":
                continue  # (the kinds a record mostly holds, skipped before the number check)
            if _finite_number(value):  # not a bool: NeMo Gym's profiler takes pandas' numeric columns only
                out[key] = float(value)
    components = record.get("reward_components")
    if isinstance(components, dict):
        out.update({COMPONENT_FIELD + name: float(value) for name, value in components.items()})
    return out


def _describe(
    rows: list[dict[str, float]], stats: dict[str, Callable[[list[float]], float]] = _STATS
) -> dict[str, float]:
    columns: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        for key, value in row.items():
            columns[key].append(value)
    return {f"{stat}/{key}": fn(values) for stat, fn in stats.items() for key, values in columns.items()}


def _across_repeats(repeats: list[dict[str, Any]]) -> dict[str, float]:
    """NeMo Gym's ``<stat>_across_repeats/mean/X``: each repeat's ``mean/X`` taken as one observation."""
    columns: dict[str, list[float]] = defaultdict(list)
    for entry in repeats:
        for key, value in entry.items():
            if key.startswith("mean/"):
                columns[key].append(value)
    return {f"{stat}_across_repeats/{key}": fn(xs) for stat, fn in _ACROSS_REPEATS.items() for key, xs in columns.items()}


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
    groups = [
        {TASK_INDEX: task, **_describe(rows), "num_rollouts": len(rows)} for task, rows in sorted(by_task.items())
    ]
    repeats = []
    if len(by_repeat) > 1:
        for repeat, entries in sorted(by_repeat.items()):
            present = len({task for task, _ in entries})
            repeats.append(
                {
                    ROLLOUT_INDEX: repeat,
                    "sample_count": present,
                    "missing_count": len(by_task) - present,
                    **_describe([row for _, row in entries], _REPEAT_STATS),
                }
            )
    agent = {**_describe(numbers), **_across_repeats(repeats), "num_repeats": len(by_repeat), **summary(records)}
    key = {name: value for name, value in agent.items() if name.startswith("mean/")}
    key.update({name: value for name, value in agent.items() if name.startswith(("pass@", "majority@"))})
    return {"group_level_metrics": groups, "agent_metrics": agent, "key_metrics": key, "repeat_level_metrics": repeats}
