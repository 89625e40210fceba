"""A finished rollout encoded where it ran: its output line, its stripped ``/aggregate_metrics`` record and
the few fields the run's counters read, as plain values that cross a pipe cheaply.

Why: with ``collect --workers N`` the rollouts run in child processes while the parent alone writes the
output (the exactly-once guarantee lives there). Encoding a record as its JSON line was about a sixth of
a rollout's CPU in the parent's loop (``output_record`` and ``whole_and_stripped_json`` under py-spy); done
in the child, the parent only writes bytes it was given, and the loop that bounds the run stays light.
The line is the one the single-process run writes (:func:`~gym_bridge.collect.output.output_record`, then
:func:`~gym_bridge.records.aggregate.whole_and_stripped_json`), so the two modes write the same files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gym_bridge.collect.output import ENV_SERVER, ROLLOUT_INDEX, TASK_INDEX, output_record
from gym_bridge.records.aggregate import whole_and_stripped_json
from gym_bridge.records.jsonl import compact_json
from gym_bridge.rollout.agent import Rollout, RolloutFailure, RolloutMetrics

__all__ = ["DIGEST_KEYS", "EncodedRollout", "decode", "encode"]

DIGEST_KEYS = (
    "reward", "extracted_answer", TASK_INDEX, "failure_kind", "mask_sample", "reward_components", "agent_ref",
    ENV_SERVER,
)  # fmt: skip
"""The record's fields the parent reads (:class:`~gym_bridge.records.metrics.RewardTally`, the run's
counters, the aggregate spool's names); ``response.usage`` is kept too, under ``response``."""

_METRICS = ("total_s", "model_calls", "tool_calls", "input_tokens", "output_tokens", "retries", "timeouts")


@dataclass(slots=True)
class EncodedRollout:
    """A rollout as the parent writes it: ``line`` (None: it failed, see ``failure``), ``stripped`` (its
    record for ``/aggregate_metrics``; None when the record has no numeric reward), ``digest`` (the
    record's :data:`DIGEST_KEYS`) and its metrics."""

    line: str | None
    stripped: str | None
    digest: dict[str, Any] | None
    failure: RolloutFailure | None
    metrics: RolloutMetrics


def encode(rollout: Rollout, task: dict[str, Any], env_name: str) -> tuple[Any, ...]:
    """``rollout`` of ``task`` (the run loop's task: the row with its ``agent_ref`` and indices) as a tuple
    of plain values (:func:`decode` makes the :class:`EncodedRollout` again)."""
    m = rollout.metrics
    metrics = (m.model_latencies_s, *(getattr(m, name) for name in _METRICS))
    if rollout.record is None:
        f = rollout.failure
        assert f is not None
        return metrics, None, None, None, (f.failure_class, f.message, f.attempts, f.stage)
    record = output_record(rollout.record, task, task[TASK_INDEX], task[ROLLOUT_INDEX], env_name)
    if isinstance(record.get("reward"), int | float):
        line, stripped = whole_and_stripped_json(record)
    else:
        line, stripped = compact_json(record), None
    digest = {key: record[key] for key in DIGEST_KEYS if key in record}
    response = record.get("response")
    if isinstance(response, dict) and response.get("usage"):
        digest["response"] = {"usage": response["usage"]}
    return metrics, line, stripped, digest, None


def decode(values: tuple[Any, ...]) -> EncodedRollout:
    """The :class:`EncodedRollout` that :func:`encode` gave as ``values``."""
    metrics, line, stripped, digest, failure = values
    latencies, *counts = metrics
    return EncodedRollout(
        line, stripped, digest, None if failure is None else RolloutFailure(*failure),
        RolloutMetrics(model_latencies_s=latencies, **dict(zip(_METRICS, counts, strict=True))),
    )  # fmt: skip
