"""collect with the built-in math server, started in-process by name (``--env math``)."""

from __future__ import annotations

import json

from collect_helpers import read_jsonl, write_rows
from fake_model import FakeModel, arithmetic_row, solve_arithmetic

from gym_bridge.collect import CollectConfig, collect, metrics_path_for


def test_collect_with_the_math_server_by_name(tmp_path):
    rows = [arithmetic_row(2, 3), arithmetic_row(4, 4), arithmetic_row(1, 0)]

    def script(request, n):
        if "4 + 4" in json.dumps(request) and n == 1:
            return "I think the answer is \\boxed{9}."
        return solve_arithmetic(request, n)

    tasks = write_rows(tmp_path / "tasks.jsonl", rows)
    with FakeModel(script) as model:
        result = collect(
            CollectConfig(tasks, tmp_path / "r.jsonl", ["math"], model_url=model.url, num_repeats=2, concurrency=1,
                          progress=False)
        )  # fmt: skip
    records = read_jsonl(result.output_path)
    assert [(r["_ng_task_index"], r["_ng_rollout_index"], r["reward"]) for r in records] == [
        (0, 0, 1.0), (0, 1, 1.0), (1, 0, 0.0), (1, 1, 1.0), (2, 0, 1.0), (2, 1, 1.0),
    ]  # fmt: skip
    assert records[2]["extracted_answer"] == "9" and records[2]["expected_answer"] == "8"
    for rec in records:
        assert {"library_reward", "judge_evaluations", "mask_sample"} <= set(rec)
        assert rec["agent_ref"] == {"name": "math_simple_agent"}  # NeMo Gym's name for the env math
    metrics = json.loads(metrics_path_for(result.output_path).read_text())
    assert metrics["mean_reward"] == 5 / 6 and metrics["pass@2"] == 1.0
    assert metrics["majority@2"] == 2 / 3  # task 1 ties 9 vs 8; the first answer seen (9, wrong) wins
