"""Ranking metrics pinned to values computed by hand, on a fixed toy scorer (no model).

The toy scorer reads each response's score from a table, so every number below follows from the
comments alone. Notation: members A, B, C, D in file order, ``(rank, score)``; a pair is "right" when
the better-ranked member scores higher. tau-b = (nc - nd) / sqrt((n0 - n1)(n0 - n2)), n0 all pairs,
n1 pairs tied in rank, n2 pairs tied in score.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gym_bridge.evaluation.ranked import (
    evaluate_ranked,
    group_metrics,
    iter_ranked,
    kendall_tau_b,
    pairwise_counts,
    top1,
)
from gym_bridge.records.jsonl import JsonlError

SCORES = {"a1": 3.0, "a2": 2.0, "a3": 1.0, "b1": 2.0, "b2": 4.0, "b3": 1.0, "b4": 3.0,
          "c1": 5.0, "c2": 1.0, "c3": 3.0, "c4": 2.0, "d1": 1.0, "d2": 1.0, "d3": 0.0,
          "e1": 7.0, "e2": 9.0}  # fmt: skip


def toy_scorer(prompt, responses):
    return [SCORES[r] for r in responses]


def group(prompt: str, *members: tuple[str, int]) -> dict:
    return {"prompt": prompt, "group": [{"response": r, "rank": k} for r, k in members]}


GROUPS = [
    # G1: A(1,3) B(2,2) C(3,1). Pairs A>B, A>C, B>C all right: 3/3 = 1.0. Top score A, rank 1: top-1 1.0.
    #     nc = 3, nd = 0, no ties: tau = 3 / sqrt(3 * 3) = 1.0.
    group("g1", ("a1", 1), ("a2", 2), ("a3", 3)),
    # G2: A(1,2) B(2,4) C(3,1) D(4,3). A-B wrong, A-C right, A-D wrong, B-C right, B-D right, C-D wrong:
    #     3/6 = 0.5. Top score B has rank 2: top-1 0.0. nc = 3, nd = 3: tau = 0 / sqrt(6 * 6) = 0.0.
    group("g2", ("b1", 1), ("b2", 2), ("b3", 3), ("b4", 4)),
    # G3 (tied ranks): A(1,5) B(1,1) C(2,3) D(3,2). A-B tied in rank, not counted. A-C right, A-D right,
    #     B-C wrong, B-D wrong, C-D right: 3/5 = 0.6. Top score A has rank 1: top-1 1.0.
    #     n0 = 6, n1 = 1 (A-B), n2 = 0, nc = 3, nd = 2: tau = 1 / sqrt(5 * 6) = 1/sqrt(30) = 0.182574...
    group("g3", ("c1", 1), ("c2", 1), ("c3", 2), ("c4", 3)),
    # G4 (tied scores): A(1,1) B(2,1) C(2,0). A-B tied in score: half, 0.5. A-C right: 1. B-C tied in rank,
    #     not counted: 1.5/2 = 0.75. Top score shared by A (rank 1) and B (rank 2): top-1 1/2 = 0.5.
    #     n0 = 3, n1 = 1 (B-C), n2 = 1 (A-B), nc = 1 (A-C), nd = 0: tau = 1 / sqrt(2 * 2) = 0.5.
    group("g4", ("d1", 1), ("d2", 2), ("d3", 2)),
    # G5: all one rank, nothing to order: every metric None, left out of the overall numbers.
    group("g5", ("e1", 1), ("e2", 1)),
]

EXPECTED = [  # (correct pairs, pairs, pairwise, top-1, tau)
    (3.0, 3, 1.0, 1.0, 1.0),
    (3.0, 6, 0.5, 0.0, 0.0),
    (3.0, 5, 0.6, 1.0, 1 / math.sqrt(30)),
    (1.5, 2, 0.75, 0.5, 0.5),
    (0.0, 0, None, None, None),
]


@pytest.mark.parametrize(("record", "expected"), list(zip(GROUPS, EXPECTED, strict=True)), ids=["g1", "g2", "g3", "g4", "g5"])
def test_group_metrics_match_the_hand_computed_values(record, expected):
    correct, pairs, pairwise, first, tau = expected
    result = group_metrics(1, record, toy_scorer(record["prompt"], [m["response"] for m in record["group"]]))
    assert (result.correct_pairs, result.pairs) == (correct, pairs)
    assert result.pairwise_accuracy == (None if pairwise is None else pytest.approx(pairwise))
    assert result.top1 == first
    assert result.kendall_tau == (None if tau is None else pytest.approx(tau))


def test_overall_numbers_pool_pairs_and_average_groups():
    report = evaluate_ranked(enumerate(GROUPS, start=1), toy_scorer)
    summary = report.summary()
    # Pooled pairs: 3 + 6 + 5 + 2 = 16, right 3 + 3 + 3 + 1.5 = 10.5: 10.5 / 16 = 0.65625.
    assert summary["pairs"] == 16
    assert summary["pairwise_accuracy"] == pytest.approx(0.65625)
    # Per-group means over the 4 groups with an order: (1 + .5 + .6 + .75) / 4 = 0.7125,
    # top-1 (1 + 0 + 1 + .5) / 4 = 0.625, tau (1 + 0 + 1/sqrt(30) + .5) / 4 = 0.420643...
    assert summary["mean_group_pairwise_accuracy"] == pytest.approx(0.7125)
    assert summary["top1_accuracy"] == pytest.approx(0.625)
    assert summary["kendall_tau"] == pytest.approx((1.5 + 1 / math.sqrt(30)) / 4)
    assert (summary["groups"], summary["rankable_groups"], summary["kendall_tau_groups"]) == (5, 4, 4)


def test_tau_b_is_undefined_when_the_scorer_ties_everything():
    # Ranks differ but every score is equal: n0 - n2 = 0, tau-b has no value; every pair counts half.
    assert kendall_tau_b([1.0, 1.0, 1.0], [1, 2, 3]) is None
    assert pairwise_counts([1.0, 1.0, 1.0], [1, 2, 3]) == (1.5, 3)
    assert top1([1.0, 1.0, 1.0], [1, 2, 3]) == pytest.approx(1 / 3)


def test_an_unscoreable_response_ranks_last_and_is_written_as_null():
    record = group("p", ("x", 1), ("", 2))
    result = group_metrics(1, record, [-0.5, -math.inf])
    assert result.pairwise_accuracy == 1.0
    line = result.to_json()
    assert [m["score"] for m in line["group"]] == [-0.5, None]
    assert [m["model_rank"] for m in line["group"]] == [1, 2]
    json.dumps(line, allow_nan=False)  # valid JSON: no Infinity


def test_a_scorer_returning_the_wrong_count_is_an_error():
    with pytest.raises(ValueError, match="2 scores for 3 responses"):
        group_metrics(1, GROUPS[0], [1.0, 2.0])


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"prompt": "p", "group": [{"response": "r", "rank": 0}]}', "'rank' must be an integer >= 1"),
        ('{"prompt": "p", "group": []}', "missing non-empty 'group'"),
        ('{"group": [{"response": "r", "rank": 1}]}', "missing 'prompt'"),
        ('{"prompt": "p", "group": [{"response": "r", "rank": 1}', "invalid JSON"),
    ],
)
def test_a_bad_line_names_the_file_and_line(tmp_path: Path, line: str, reason: str):
    path = tmp_path / "ranked.jsonl"
    path.write_text(json.dumps(GROUPS[0]) + "\n" + line + "\n")
    with pytest.raises(JsonlError) as info:
        list(iter_ranked(path))
    assert str(info.value).startswith(f"{path}:2: ")
    assert reason in str(info.value)
