"""``collect --rollout-timeout``: a tool that never answers costs a rollout the deadline, not the request timeout.

The env is a real resources server on loopback whose every tool call hangs
(:class:`~tests.train.straggler_env.StragglerEnv`); the model is the scripted fake that always calls it.
Without the flag each rollout would wait out ``--request-timeout`` (20 s here) before failing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from collect_helpers import read_jsonl, write_rows
from fake_model import FakeModel, function_call
from typer.testing import CliRunner

from gym_bridge.cli import app
from gym_bridge.collect import failures_path_for, metrics_path_for
from gym_bridge.serving.uvicorn_thread import start_in_thread
from tests.train.straggler_env import StragglerConfig, StragglerEnv


@pytest.fixture()
def hanging_env() -> Iterator[tuple[str, StragglerEnv]]:
    env = StragglerEnv(config=StragglerConfig(hang_every=1, hang_in="tool"))  # every tool call hangs
    running = start_in_thread(env.build_app())
    try:
        yield running.url, env
    finally:
        running.stop(timeout=1.0)  # its hung handlers never end; the daemon thread goes with the process


def _rows(n: int) -> list[dict]:
    return [
        {"responses_create_params": {"input": [{"role": "user", "content": f"Add 1 of P{i}."}]}}
        for i in range(n)
    ]


def test_a_tool_that_never_answers_fails_the_rollout_at_its_deadline(tmp_path, hanging_env) -> None:
    env_url, env = hanging_env
    tasks = write_rows(tmp_path / "tasks.jsonl", _rows(2))
    out = tmp_path / "r.jsonl"
    call = function_call("add_to_cart", {"product_id": "P1", "quantity": 1})
    with FakeModel(default=[call]) as model:
        started = time.perf_counter()
        result = CliRunner().invoke(
            app,
            ["collect", str(tasks), "-o", str(out), "--env", env_url, "--model-url", model.url,
             "--concurrency", "2", "--request-timeout", "20", "--rollout-timeout", "0.5", "--no-progress"],
            env={"COLUMNS": "200"},
        )  # fmt: skip
        elapsed = time.perf_counter() - started
    assert result.exit_code == 1, result.output  # no rollout succeeded
    assert elapsed < 10.0  # both rollouts cut off at 0.5 s, not after the 20 s request timeout
    assert env.hung == 2
    failures = read_jsonl(failures_path_for(out))
    assert [f["_ng_failure_class"] for f in failures] == ["rollout_timeout"] * 2
    assert all("0.5 s deadline in tool" in f["error"] and f["error"].endswith("/add_to_cart") for f in failures)
    run = json.loads(metrics_path_for(out).read_text())["run"]
    assert run["rollouts_failed"] == 2 and run["failures_by_class"] == {"rollout_timeout": 2}
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in result.output.splitlines() if "│" in line]
    assert dict(cells)["failures: rollout_timeout"] == "2"
    assert "failure cause (rollout_timeout, 2x)" in result.output


def test_a_rollout_timeout_that_is_not_positive_is_refused_by_name(tmp_path) -> None:
    tasks = write_rows(tmp_path / "tasks.jsonl", _rows(1))
    result = CliRunner().invoke(
        app,
        ["collect", str(tasks), "-o", str(tmp_path / "r.jsonl"), "--env", "math",
         "--model-url", "http://127.0.0.1:9/v1", "--rollout-timeout", "0", "--no-progress"],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert result.exit_code != 0
    assert "--rollout-timeout must be a positive number of seconds" in result.output
