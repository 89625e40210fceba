"""majority@k over every task: a task where no sample gives an answer counts as wrong (issue 13).

Averaged only over tasks with an answer, a run of a weak model reported majority@4 = 0.217 above
pass@4 = 0.083; majority voting can never do better than "any of the k is right".
"""

from __future__ import annotations

import itertools
import json
import random

import pytest
from collect_helpers import write_rows
from fake_model import FakeModel, arithmetic_row, solve_arithmetic

from gym_bridge.collect import CollectConfig, collect, metrics_path_for
from gym_bridge.records.metrics import aggregate_rewards, majority_at_k


def rollouts(task: int, answers: list[str | None], expected: str) -> list[dict]:
    return [
        {"_ng_task_index": task, "_ng_rollout_index": i, "extracted_answer": a, "reward": float(a == expected)}
        for i, a in enumerate(answers)
    ]


def test_tasks_without_an_answer_count_as_wrong():
    records = rollouts(0, ["4", "4", "5", None], "4") + [
        r for t in range(1, 4) for r in rollouts(t, [None] * 4, "4")
    ]
    metrics = aggregate_rewards(records)
    assert metrics["pass@4"] == 0.25
    assert metrics["majority@4"] == 0.25  # the old average over answered tasks only said 1.0


def test_no_majority_without_any_answer():
    assert "majority@2" not in aggregate_rewards([{"_ng_task_index": 0, "reward": 1.0}] * 2)


def test_majority_never_exceeds_pass_at_k_even_with_uneven_groups():
    rng = random.Random(7)
    for _ in range(200):
        records = []
        for task in range(rng.randint(1, 5)):
            n = rng.randint(1, 7)
            records += rollouts(task, [rng.choice(["1", "2", "3", None]) for _ in range(n)], "1")
        metrics = aggregate_rewards(records)
        k = min(sum(r["_ng_task_index"] == t for r in records) for t in {r["_ng_task_index"] for r in records})
        assert metrics[f"majority@{k}"] <= metrics[f"pass@{k}"] + 1e-12, records


def test_majority_at_k_over_subsets():
    votes = [("2", True), ("3", False), ("3", False), (None, False)]
    assert majority_at_k(votes, 4) == 0.0  # 3 wins
    expected = sum(
        1 for s in itertools.combinations(range(4), 2) if [votes[i][0] for i in s if votes[i][0]][:1] == ["2"]
    ) / 6  # with two samples, "2" wins whenever it is drawn (a tie goes to the first seen)
    assert majority_at_k(votes, 2) == pytest.approx(expected)
    many = [("2", True)] * 3 + [("3", False)] * 27  # C(30, 15) subsets: drawn, and capped at pass@k
    assert 0.0 <= majority_at_k(many, 15) <= 1.0


def test_collect_reports_majority_over_every_task(tmp_path, boxed_env):
    rows = [arithmetic_row(1, 1), arithmetic_row(2, 2), arithmetic_row(3, 3)]

    def script(request, n):  # only the first task is ever answered in a box
        return solve_arithmetic(request, n) if "1 + 1" in json.dumps(request) else "It is 4, I think."

    tasks = write_rows(tmp_path / "tasks.jsonl", rows)
    with FakeModel(script) as model:
        result = collect(
            CollectConfig(tasks, tmp_path / "r.jsonl", [boxed_env[0]], model_url=model.url, num_repeats=2,
                          progress=False, request_timeout=30.0),
            report=lambda _: None,
        )  # fmt: skip
    metrics = json.loads(metrics_path_for(result.output_path).read_text())
    assert metrics["pass@2"] == pytest.approx(1 / 3)
    assert metrics["majority@2"] == pytest.approx(1 / 3)


def test_a_reward_that_is_no_finite_number_counts_as_zero_as_in_the_viewer():
    """A string "1" counted 1.0 in the run's metrics (and "nan" NaN) while the viewer counts such a reward
    as missing (0): the two showed different means for one file."""
    records = [{"_ng_task_index": i, "reward": r} for i, r in enumerate([1.0, "1", "nan", None, True, 10**400])]
    metrics = aggregate_rewards(records)
    assert metrics["mean_reward"] == pytest.approx(1 / 6)
    assert metrics["pass@1"] == pytest.approx(1 / 6)


def test_only_a_boolean_true_mask_sample_counts_as_masked():
    """The trainer refuses a mask_sample that is no boolean; the run's metrics counted the string "false" masked."""
    records = [{"_ng_task_index": i, "reward": 0.0, "mask_sample": m} for i, m in enumerate([True, "false", 1, None])]
    assert aggregate_rewards(records)["masked_samples"] == 1
