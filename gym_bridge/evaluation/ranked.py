"""Group ranking accuracy: does a scorer order each ranked group's responses as the ranks do?

A ranked group is ``{"prompt", "group": [{"response", "rank"}]}`` (what ``transform ranked`` writes),
rank 1 the best, equal ranks tied. The scorer (a model's length-normalised log-probability, see
:mod:`gym_bridge.evaluation.scoring`, or any function in tests) gives each response a number, higher
meaning better. Per group and overall:

* pairwise accuracy: over pairs of members with different ranks (pairs tied in rank are not counted),
  the share the scorer puts in the ranks' order; a pair the scorer ties counts half.
* top-1: whether the top-scored member has the group's best rank (when several members tie for the
  top score, the share of them that do).
* Kendall's tau-b between scores and ranks, which corrects for ties on either side.

A group whose members all share one rank (or a single member) has nothing to order: its metrics are
None and it is left out of the overall numbers. Overall pairwise accuracy pools the pairs of all groups;
top-1 and tau are means over the groups where they are defined. Nothing here imports torch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gym_bridge.records.jsonl import JsonlError, iter_jsonl
from transforms.common import RecordError
from transforms.ranked import check_ranked, dense_ranks

__all__ = [
    "GroupResult",
    "RankedReport",
    "Scorer",
    "evaluate_ranked",
    "group_metrics",
    "iter_ranked",
    "kendall_tau_b",
    "pairwise_counts",
    "top1",
]

Scorer = Callable[[Any, Sequence[Any]], list[float]]
"""``scorer(prompt, responses) -> one score per response``, higher is better."""


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def _pair_signs(scores: Sequence[float], ranks: Sequence[int]) -> Iterator[tuple[int, int]]:
    """For each unordered pair: (+1 if the first member ranks better, -1 worse, 0 tied;
    +1 if the first member scores higher, -1 lower, 0 tied)."""
    n = len(scores)
    for i in range(n):
        for j in range(i + 1, n):
            yield _sign(ranks[j] - ranks[i]), _sign(scores[i] - scores[j])


def pairwise_counts(scores: Sequence[float], ranks: Sequence[int]) -> tuple[float, int]:
    """(correct, counted) over the pairs not tied in rank; a pair tied in score counts half correct."""
    correct, counted = 0.0, 0
    for by_rank, by_score in _pair_signs(scores, ranks):
        if by_rank == 0:
            continue
        counted += 1
        correct += 1.0 if by_rank == by_score else 0.5 if by_score == 0 else 0.0
    return correct, counted


def top1(scores: Sequence[float], ranks: Sequence[int]) -> float | None:
    """Share of the top-scored members that hold the best rank; None when all ranks are equal."""
    best = min(ranks)
    if all(r == best for r in ranks):
        return None
    top = max(scores)
    tops = [r for s, r in zip(scores, ranks, strict=True) if s == top]
    return sum(r == best for r in tops) / len(tops)


def kendall_tau_b(scores: Sequence[float], ranks: Sequence[int]) -> float | None:
    """Kendall's tau-b of scores against ranks (rank 1 best), ``(nc - nd) / sqrt((n0 - n1)(n0 - n2))``
    with n1 pairs tied in rank and n2 tied in score; None when either side is all ties."""
    concordant = discordant = tied_rank = tied_score = total = 0
    for by_rank, by_score in _pair_signs(scores, ranks):
        total += 1
        tied_rank += by_rank == 0
        tied_score += by_score == 0
        if by_rank and by_score:
            concordant += by_rank == by_score
            discordant += by_rank != by_score
    denominator = (total - tied_rank) * (total - tied_score)
    if denominator == 0:
        return None
    return (concordant - discordant) / math.sqrt(denominator)


@dataclass
class GroupResult:
    """One group's scores and metrics (the metrics are None for a group with nothing to order)."""

    line: int
    prompt: Any
    responses: list[Any]
    ranks: list[int]
    scores: list[float]
    correct_pairs: float
    pairs: int
    pairwise_accuracy: float | None
    top1: float | None
    kendall_tau: float | None

    def to_json(self) -> dict[str, Any]:
        """The per-group output line: members with their rank, score and the scorer's own (dense) rank."""
        model_ranks = dense_ranks(self.scores)
        return {
            "line": self.line,
            "prompt": self.prompt,
            "pairwise_accuracy": self.pairwise_accuracy,
            "top1": self.top1,
            "kendall_tau": self.kendall_tau,
            "pairs": self.pairs,
            "group": [
                {"response": r, "rank": k, "score": _finite_or_none(s), "model_rank": m}
                for r, k, s, m in zip(self.responses, self.ranks, self.scores, model_ranks, strict=True)
            ],
        }


def _finite_or_none(x: float) -> float | None:
    """JSON has no infinities: an unscoreable (empty) response is written as null."""
    return x if math.isfinite(x) else None


def group_metrics(line: int, record: dict[str, Any], scores: Sequence[float]) -> GroupResult:
    """Score one checked ranked record's metrics from the scorer's ``scores`` (one per member)."""
    members = record["group"]
    ranks = [int(m["rank"]) for m in members]
    if len(scores) != len(ranks):
        raise ValueError(f"the scorer returned {len(scores)} scores for {len(ranks)} responses")
    correct, pairs = pairwise_counts(scores, ranks)
    return GroupResult(
        line=line,
        prompt=record["prompt"],
        responses=[m["response"] for m in members],
        ranks=ranks,
        scores=[float(s) for s in scores],
        correct_pairs=correct,
        pairs=pairs,
        pairwise_accuracy=correct / pairs if pairs else None,
        top1=top1(scores, ranks),
        kendall_tau=kendall_tau_b(scores, ranks),
    )


def _mean(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


@dataclass
class RankedReport:
    """Overall numbers of one evaluation, accumulated group by group (only the metrics are kept, so a
    large file does not hold its responses in memory)."""

    groups: int = 0
    per_group: list[tuple[float, int, float | None, float | None]] = field(default_factory=list)

    def add(self, result: GroupResult) -> None:
        self.groups += 1
        if result.pairs:
            self.per_group.append((result.correct_pairs, result.pairs, result.top1, result.kendall_tau))

    def summary(self) -> dict[str, Any]:
        """The JSON report's numbers."""
        pairs = sum(p for _, p, _, _ in self.per_group)
        correct = sum(c for c, _, _, _ in self.per_group)
        return {
            "groups": self.groups,
            "rankable_groups": len(self.per_group),
            "pairs": pairs,
            "pairwise_accuracy": correct / pairs if pairs else None,
            "mean_group_pairwise_accuracy": _mean(c / p for c, p, _, _ in self.per_group),
            "top1_accuracy": _mean(t for _, _, t, _ in self.per_group),
            "kendall_tau": _mean(k for _, _, _, k in self.per_group),
            "kendall_tau_groups": sum(k is not None for _, _, _, k in self.per_group),
        }


def iter_ranked(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, record)`` for each ranked group of ``path``; a bad line raises :class:`JsonlError`
    naming the file and line (a line that is JSON but not a ranked group included)."""
    for line, record in iter_jsonl(path, strict=True):
        try:
            yield line, check_ranked(record)
        except RecordError as err:
            raise JsonlError(path, line, str(err)) from None


def evaluate_ranked(
    records: Iterable[tuple[int, dict[str, Any]]],
    scorer: Scorer,
    on_group: Callable[[GroupResult], None] | None = None,
) -> RankedReport:
    """Score every ``(line, record)`` with ``scorer`` and collect the metrics; ``on_group`` sees each
    group's result as it is done (progress bars, streaming the per-group output)."""
    report = RankedReport()
    for line, record in records:
        responses = [m["response"] for m in record["group"]]
        result = group_metrics(line, record, scorer(record["prompt"], responses))
        report.add(result)
        if on_group is not None:
            on_group(result)
    return report
