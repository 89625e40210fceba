"""Aggregate metrics over verified rollouts: mean reward, pass@k, majority@k, token counts, failures.

Used by every resources server's ``/aggregate_metrics`` and by ``collect`` for its end-of-run report.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections import Counter, defaultdict
from typing import Any


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
    """Summary of a list of rollout / verify-response dicts.

    A rollout counts as correct when ``reward >= success_threshold``. pass@k and majority@k use the
    largest k every task has (the number of repeats) and average over every task. majority@k votes on
    ``extracted_answer`` (see :func:`majority_at_k`) and is reported when the verifier gives answers; a
    task where no sample has one counts as wrong, so majority@k <= pass@k.
    """
    if not records:
        return {"num_rollouts": 0, "num_tasks": 0, "mean_reward": None}
    # one pass over the records (a run's end summarises every rollout), then one per task
    groups: dict[Any, list[tuple[float, Any]]] = defaultdict(list)  # task -> (reward, extracted answer)
    rewards, input_tokens, output_tokens, failures, masked = [], [], [], Counter(), 0
    for rec in records:
        reward = float(rec.get("reward") or 0.0)
        rewards.append(reward)
        groups[_group_key(rec)].append((reward, rec.get("extracted_answer")))
        usage = (rec.get("response") or {}).get("usage") or {}
        if usage:
            input_tokens.append(int(usage.get("input_tokens") or 0))
            output_tokens.append(int(usage.get("output_tokens") or 0))
        if rec.get("failure_kind"):
            failures[rec["failure_kind"]] += 1
        masked += bool(rec.get("mask_sample"))
    has_answers = any(answer is not None for group in groups.values() for _, answer in group)
    k = min(len(g) for g in groups.values())
    pass_k, pass_1, majority = [], [], []
    for group in groups.values():
        n = len(group)
        verdicts = [reward >= success_threshold for reward, _ in group]
        correct = sum(verdicts)
        pass_k.append(pass_at_k(n, correct, k))
        pass_1.append(pass_at_k(n, correct, 1))
        if has_answers:  # majority@k is reported only then
            votes = [(None if a is None else str(a), ok) for (_, a), ok in zip(group, verdicts, strict=True)]
            majority.append(majority_at_k(votes, k))
    out: dict[str, Any] = {
        "num_rollouts": len(records),
        "num_tasks": len(groups),
        "mean_reward": sum(rewards) / len(rewards),
        "pass@1": sum(pass_1) / len(pass_1),
        f"pass@{k}": sum(pass_k) / len(pass_k),
    }
    if has_answers:
        out[f"majority@{k}"] = sum(majority) / len(majority)
    if output_tokens:
        out["mean_input_tokens"] = sum(input_tokens) / len(input_tokens)
        out["mean_output_tokens"] = sum(output_tokens) / len(output_tokens)
        out["total_output_tokens"] = sum(output_tokens)
    out["failure_kinds"] = dict(failures)
    out["masked_samples"] = masked
    return out


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
