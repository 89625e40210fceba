"""Aggregate metrics over verified rollouts: mean reward, pass@k, majority@k, token counts, failures.

Used by every resources server's ``/aggregate_metrics`` and by ``collect`` for its end-of-run report.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import tempfile
from collections import Counter, defaultdict
from fractions import Fraction
from typing import IO, Any

from gym_bridge.records.schema import is_finite_number


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021): chance that at least one of k of n samples is correct."""
    if k > n:
        k = n
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


MAJORITY_SUBSETS = 5000
"""Most k-subsets of a task's samples majority@k votes over exactly; more are sampled (seeded)."""


def majority_at_k(votes: list[tuple[str | None, bool]], k: int) -> float:
    """Chance that the most common answer among k of a task's samples is a correct one.

    ``votes`` holds each sample's ``(extracted answer or None, correct)``. Over every k-subset (or
    :data:`MAJORITY_SUBSETS` seeded draws of one when there are more): the answer given most often wins,
    ties to the one seen first, and the subset counts as right when the winner's first sample is correct.
    A sample without an answer does not vote; a subset without a vote is wrong. Each subset is right only
    if some sample in it is, so the result never exceeds pass@k.
    """
    n = len(votes)
    k = min(k, n)
    if k <= 0:
        return 0.0

    def right(subset: tuple[int, ...]) -> bool:
        counts: dict[str, int] = {}  # in the order first seen, so max() breaks ties to the first
        for i in subset:
            if (answer := votes[i][0]) is not None:
                counts[answer] = counts.get(answer, 0) + 1
        if not counts:
            return False
        top = max(counts, key=counts.__getitem__)
        return next(votes[i][1] for i in subset if votes[i][0] == top)

    if math.comb(n, k) <= MAJORITY_SUBSETS:
        subsets = list(itertools.combinations(range(n), k))
        return sum(map(right, subsets)) / len(subsets)
    rng = random.Random(n * 1_000_003 + k)
    drawn = [tuple(sorted(rng.sample(range(n), k))) for _ in range(MAJORITY_SUBSETS)]
    estimate = sum(map(right, drawn)) / len(drawn)
    return min(estimate, pass_at_k(n, sum(correct for _, correct in votes), k))


def _group_key(record: dict[str, Any]) -> Any:
    if record.get("_ng_task_index") is not None:
        return record["_ng_task_index"]
    return json.dumps(record.get("responses_create_params", {}).get("input"), sort_keys=True)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` in [0, 100] of ``values`` (NaN when empty)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def aggregate_rewards(records: list[dict[str, Any]], success_threshold: float = 1.0) -> dict[str, Any]:
    """Summary of a list of rollout / verify-response dicts (:class:`RewardTally` over them; a ``records``
    with a ``group_size`` attribute, a view streamed from a file, has its tasks' groups closed at that size).

    A rollout counts as correct when ``reward >= success_threshold``. pass@k and majority@k use the
    largest k every task has (the number of repeats) and average over every task. majority@k votes on
    ``extracted_answer`` (see :func:`majority_at_k`) and is reported when the verifier gives answers; a
    task where no sample has one counts as wrong, so majority@k <= pass@k.
    """
    tally = RewardTally(success_threshold, group_size=getattr(records, "group_size", None))
    for record in records:
        tally.add(record)
    return tally.result()


class RewardTally:
    """:func:`aggregate_rewards` fed one record at a time, holding only the tasks still open.

    Why: a run of a million rollouts kept every record (slimmed) to summarise them at the end, ~1 KB a
    rollout. Here a task's group is reduced to its counts when :meth:`close` says it is complete (collect
    knows: NeMo Gym's "aabbcc" order finishes a task's repeats together); each closed group keeps
    (size, correct) for pass@k, its majority@size, and its votes in a temporary file, read back only if
    another group turns out smaller (k is the smallest group's size, known at the end).
    """

    def __init__(self, success_threshold: float = 1.0, group_size: int | None = None) -> None:
        self.threshold = success_threshold
        self.group_size = group_size
        """Close a task's group once it has this many records (records that come once per (task, repeat))."""
        self.open: dict[Any, list[tuple[float, Any]]] = {}
        """Task -> (reward, extracted answer) of each of its records so far, in arrival order."""
        self.rollouts, self.reward_sum = 0, 0.0
        self.input_tokens, self.output_tokens, self.with_usage = 0, 0, 0
        self.failures: Counter[str] = Counter()
        self.masked = 0
        self.has_answers = False
        self.closed_sizes: Counter[tuple[int, int]] = Counter()  # (group size, correct) -> groups
        self.closed_majority: defaultdict[int, Fraction] = defaultdict(Fraction)  # size -> sum of majority@size
        self.closed_votes: IO[str] | None = None
        self.component_sums: dict[str, float] = {}
        self.component_counts: Counter[str] = Counter()

    def add(self, record: dict[str, Any]) -> None:
        """Count one record (its task's group stays open until :meth:`close` or :meth:`result`)."""
        reward = float(record["reward"]) if is_finite_number(record.get("reward")) else 0.0  # "1", NaN, null: 0
        answer = record.get("extracted_answer")
        self.rollouts += 1
        self.reward_sum += reward
        self.has_answers = self.has_answers or answer is not None
        key = _group_key(record)
        group = self.open.get(key)
        if group is None:
            group = self.open[key] = [(reward, answer)]
        else:
            group.append((reward, answer))
        if self.group_size is not None and len(group) >= self.group_size:
            self.close(key)
        response = record.get("response")
        usage = response.get("usage") if isinstance(response, dict) else None
        if usage:
            self.with_usage += 1
            self.input_tokens += int(usage.get("input_tokens") or 0)
            self.output_tokens += int(usage.get("output_tokens") or 0)
        if record.get("failure_kind"):
            self.failures[record["failure_kind"]] += 1
        self.masked += record.get("mask_sample") is True  # "false" is no mask (the trainer refuses it)
        components = record.get("reward_components")
        if isinstance(components, dict):
            for name, value in components.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    self.component_sums[name] = self.component_sums.get(name, 0.0) + float(value)
                    self.component_counts[name] += 1

    def close(self, key: Any) -> None:
        """The task ``key`` (its ``_ng_task_index``) gets no more records: reduce its group to counts."""
        group = self.open.pop(key, None)
        if not group:
            return
        n, votes = len(group), self._votes(group)
        self.closed_sizes[(n, sum(ok for _, ok in votes))] += 1
        self.closed_majority[n] += Fraction(majority_at_k(votes, n))
        if self.closed_votes is None:
            self.closed_votes = tempfile.TemporaryFile("w+", prefix="gym-bridge-votes-")
        self.closed_votes.write(json.dumps(votes) + "\n")

    def _votes(self, group: list[tuple[float, Any]]) -> list[tuple[str | None, bool]]:
        return [(None if a is None else str(a), reward >= self.threshold) for reward, a in group]

    def component_means(self) -> dict[str, float]:
        """Mean of each reward component over the records that carry it, by name in sorted order."""
        return {name: self.component_sums[name] / self.component_counts[name] for name in sorted(self.component_sums)}

    def result(self) -> dict[str, Any]:
        """The summary :func:`aggregate_rewards` gives for every record added (open groups included)."""
        if not self.rollouts:
            return {"num_rollouts": 0, "num_tasks": 0, "mean_reward": None}
        sizes = [n for n, _ in self.closed_sizes] + [len(g) for g in self.open.values()]
        k = min(sizes)
        # Sums over tasks are exact (fractions), so the figure does not depend on the order tasks closed in.
        pass_k = pass_1 = majority = Fraction(0)
        tasks = 0
        for (n, correct), count in self.closed_sizes.items():
            pass_k += count * Fraction(pass_at_k(n, correct, k))
            pass_1 += count * Fraction(pass_at_k(n, correct, 1))
            tasks += count
        if self.has_answers:
            if all(n == k for n, _ in self.closed_sizes):
                majority = self.closed_majority.get(k, Fraction(0))
            elif self.closed_votes is not None:  # a smaller group came later: vote again at its k
                self.closed_votes.seek(0)
                for line in self.closed_votes:
                    majority += Fraction(majority_at_k([tuple(v) for v in json.loads(line)], k))
        for group in self.open.values():
            votes = self._votes(group)
            correct = sum(ok for _, ok in votes)
            pass_k += Fraction(pass_at_k(len(group), correct, k))
            pass_1 += Fraction(pass_at_k(len(group), correct, 1))
            if self.has_answers:  # majority@k is reported only then
                majority += Fraction(majority_at_k(votes, k))
            tasks += 1
        out: dict[str, Any] = {
            "num_rollouts": self.rollouts,
            "num_tasks": tasks,
            "mean_reward": self.reward_sum / self.rollouts,
            "pass@1": float(pass_1) / tasks,
            f"pass@{k}": float(pass_k) / tasks,
        }
        if self.has_answers:
            out[f"majority@{k}"] = float(majority) / tasks
        if self.with_usage:
            out["mean_input_tokens"] = self.input_tokens / self.with_usage
            out["mean_output_tokens"] = self.output_tokens / self.with_usage
            out["total_output_tokens"] = self.output_tokens
        out["failure_kinds"] = dict(self.failures)
        out["masked_samples"] = self.masked
        return out

    def discard(self) -> None:
        """Remove the votes file (also done when the tally is garbage-collected)."""
        if self.closed_votes is not None:
            self.closed_votes.close()
            self.closed_votes = None


def latency_summary(values: list[float]) -> dict[str, float | int | None]:
    """Count, mean, p50/p90/p99 and max of a list of durations in seconds (None values when empty)."""
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    return {
        "count": len(values),
        "mean": sum(values) / len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values),
    }


class LatencySketch:
    """:func:`latency_summary` of durations fed one at a time, in bounded memory.

    Why: a run kept every model call's and rollout's latency (two floats a rollout, plus a list's growth)
    to take percentiles at the end. The first :data:`EXACT` values are kept and summarised exactly; past
    that they go into log-spaced buckets (each 1 % wide), so p50/p90/p99 are within 0.5 % of the exact
    value while count, mean and max stay exact; memory is at most a few thousand buckets.
    """

    EXACT = 4096
    RATIO = 1.01
    FLOOR = 1e-6
    """Durations below this (seconds) share the lowest bucket."""

    def __init__(self) -> None:
        self.values: list[float] | None = []
        self.buckets: Counter[int] = Counter()
        self.count, self.total, self.largest = 0, 0.0, float("-inf")

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.largest = max(self.largest, value)
        if self.values is not None:
            self.values.append(value)
            if len(self.values) > self.EXACT:
                for v in self.values:
                    self.buckets[self._bucket(v)] += 1
                self.values = None
        else:
            self.buckets[self._bucket(value)] += 1

    def extend(self, values: list[float]) -> None:
        for value in values:
            self.add(value)

    def _bucket(self, value: float) -> int:
        return math.floor(math.log(max(value, self.FLOOR) / self.FLOOR, self.RATIO))

    def _quantile(self, q: float) -> float:
        rank, seen = (self.count - 1) * q / 100.0, 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            if seen > rank:
                mid = self.FLOOR * self.RATIO ** (bucket + 0.5)  # the bucket's geometric middle
                return min(mid, self.largest)
        return self.largest

    def summary(self) -> dict[str, float | int | None]:
        """What :func:`latency_summary` says (exactly, up to :data:`EXACT` values)."""
        if self.values is not None:
            return latency_summary(self.values)
        return {
            "count": self.count,
            "mean": self.total / self.count,
            "p50": self._quantile(50),
            "p90": self._quantile(90),
            "p99": self._quantile(99),
            "max": self.largest,
        }
