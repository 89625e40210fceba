"""collect over loopback against a multi-reward env: records keep ``reward_components`` as the env sent
them, the metrics file, the summary and NeMo Gym's aggregate file have a mean per component, pass@k stays
on ``reward``, and an env answer with a bad component is a failed rollout naming it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from collect_helpers import read_jsonl, write_rows
from fake_model import FakeModel, arithmetic_row, solve_arithmetic

from gym_bridge.collect import (
    CollectConfig,
    aggregate_metrics_path_for,
    collect,
    failures_path_for,
    metrics_path_for,
)
from gym_bridge.serving.uvicorn_thread import start_in_thread
from tests.multi_reward_env import MultiRewardEnv


@pytest.fixture(scope="module")
def env_url() -> Iterator[str]:
    with start_in_thread(MultiRewardEnv().build_app()) as running:
        yield running.url


def script(request, n):
    """Task "2 + 2": repeat 1 unboxed ("4!", even length), repeat 2 right; the others right."""
    if "2 + 2" in json.dumps(request) and n == 1:
        return "It is 4"
    return solve_arithmetic(request, n)


def test_collect_keeps_components_and_reports_a_mean_per_component(tmp_path, env_url) -> None:
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(1, 1), arithmetic_row(2, 2)])
    with FakeModel(script) as model:
        result = collect(
            CollectConfig(tasks, tmp_path / "r.jsonl", [env_url], model_url=model.url, num_repeats=2,
                          concurrency=1, progress=False)
        )  # fmt: skip
    records = read_jsonl(result.output_path)
    # "The answer is \boxed{2}." has 24 characters, "...\boxed{4}." 24, "It is 4" 7
    assert [(r["_ng_task_index"], r["reward_components"]) for r in records] == [
        (0, {"correct": 1.0, "format": 1.0, "even_length": 1.0}),
        (0, {"correct": 1.0, "format": 1.0, "even_length": 1.0}),
        (1, {"correct": 0.0, "format": 0.0, "even_length": 0.0}),
        (1, {"correct": 1.0, "format": 1.0, "even_length": 1.0}),
    ]
    assert [r["reward"] for r in records] == [3.0, 3.0, 0.0, 3.0]
    metrics = json.loads(metrics_path_for(result.output_path).read_text())
    assert metrics["reward_components"] == {"correct": 0.75, "even_length": 0.75, "format": 0.75}
    assert metrics["mean_reward"] == 2.25
    assert metrics["pass@1"] == 0.75 and metrics["pass@2"] == 1.0  # on reward (>= 1 counts), as before
    [entry] = json.loads(aggregate_metrics_path_for(result.output_path).read_text())
    assert entry["agent_metrics"]["mean/reward_components.correct"] == 0.75
    assert entry["key_metrics"]["mean/reward_components.format"] == 0.75
    assert entry["group_level_metrics"][1]["mean/reward_components.correct"] == 0.5


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # the env dumps its unchecked answer
def test_a_bad_component_in_the_env_answer_fails_the_rollout_naming_it(tmp_path, env_url) -> None:
    rows = [arithmetic_row(1, 1), arithmetic_row(1, 2, bad_components=True)]
    tasks = write_rows(tmp_path / "tasks.jsonl", rows)
    with FakeModel(solve_arithmetic) as model:
        result = collect(
            CollectConfig(tasks, tmp_path / "r.jsonl", [env_url], model_url=model.url, concurrency=1,
                          progress=False)
        )  # fmt: skip
    assert [r["_ng_task_index"] for r in read_jsonl(result.output_path)] == [0]
    [failure] = read_jsonl(failures_path_for(result.output_path))
    assert failure["_ng_task_index"] == 1 and failure["stage"] == "verify"
    assert "reward_components: correct: expected a finite number, got 'high'" in failure["error"]


def test_the_cli_summary_shows_a_mean_per_component(tmp_path, env_url) -> None:
    from typer.testing import CliRunner

    from gym_bridge.cli import app

    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(1, 1), arithmetic_row(2, 2)])
    with FakeModel(script) as model:
        result = CliRunner().invoke(
            app,
            ["collect", str(tasks), "-o", str(tmp_path / "r.jsonl"), "--env", env_url, "--model-url", model.url,
             "--num-repeats", "2", "--concurrency", "1", "--no-progress"],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [" ".join(line.replace("│", " ").split()) for line in result.output.splitlines()]
    assert any("mean reward_components.correct 0.75" in line for line in lines), result.output
    assert any("mean reward_components.even_length 0.75" in line for line in lines), result.output
