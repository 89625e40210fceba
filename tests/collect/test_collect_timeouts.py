"""A slow model is not asked twice: sized timeouts, timeouts not re-sent unless asked, retries shown.

Issue 13: a 300 s timeout made collect send every request of a 135M CPU model's first batch twice, and
the summary did not say so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from collect_helpers import read_jsonl, write_rows
from fake_model import FakeModel, Fault, arithmetic_row, flaky
from typer.testing import CliRunner

from gym_bridge.cli import app
from gym_bridge.collect import CollectConfig, CollectError, collect, failures_path_for, metrics_path_for
from gym_bridge.collect.config import sized_request_timeout


def config_for(tmp_path, model_url, env_url, rows, **kw):
    tasks = write_rows(tmp_path / "tasks.jsonl", rows)
    settings = dict(envs=[env_url], request_timeout=0.5, max_retries=2, progress=False, concurrency=4)
    return CollectConfig(tasks, tmp_path / "rollouts.jsonl", model_url=model_url, **{**settings, **kw})


def test_a_timed_out_request_is_not_sent_again_but_errors_still_are(tmp_path, boxed_env):
    script = {"1 + 1": Fault.slow(30), "1 + 2": flaky(Fault.http(503), times=1), "1 + 3": flaky(Fault.drop(), times=1)}
    rows = [arithmetic_row(1, 1), arithmetic_row(1, 2), arithmetic_row(1, 3)]
    with FakeModel(script) as model:
        result = collect(config_for(tmp_path, model.url, boxed_env[0], rows), report=lambda _: None)
        calls = {prompt: n for prompt in script for p, n in model.calls.items() if prompt in p}
    assert calls == {"1 + 1": 1, "1 + 2": 2, "1 + 3": 2}
    [failure] = read_jsonl(failures_path_for(result.output_path))
    assert failure["_ng_failure_class"] == "model_timeout" and failure["attempts"] == 1
    assert "not sent again" in failure["error"]
    run = json.loads(metrics_path_for(result.output_path).read_text())["run"]
    assert run["retries"] == 2 and run["retry_timeouts"] is False and run["request_timeout_s"] == 0.5
    assert result.written == 2


def test_retry_timeouts_sends_a_timed_out_request_again(tmp_path, boxed_env):
    with FakeModel({"1 + 1": Fault.slow(30)}) as model:
        result = collect(
            config_for(tmp_path, model.url, boxed_env[0], [arithmetic_row(1, 1)], retry_timeouts=True),
            report=lambda _: None,
        )
        assert model.calls.total() == 3
    [failure] = read_jsonl(failures_path_for(result.output_path))
    assert failure["_ng_failure_class"] == "model_timeout" and failure["attempts"] == 3
    assert json.loads(metrics_path_for(result.output_path).read_text())["run"]["retries"] == 2


def test_the_default_timeout_grows_with_concurrency_and_tokens(tmp_path):
    # the run: 64 in flight, 128 tokens, ~23 tokens/s in all -> about 356 s per batch, past 300 s
    assert sized_request_timeout(64, 128) == pytest.approx(60 + 64 * 128 / 10)
    assert sized_request_timeout(64, 128) > 64 * 128 / 23
    assert sized_request_timeout(1, 16) == 300.0  # never below the old fixed value
    assert sized_request_timeout(10_000, None) == 3600.0  # a hung server still ends the run
    assert sized_request_timeout(16, None) == pytest.approx(60 + 16 * 1024 / 10)
    tasks = write_rows(tmp_path / "t.jsonl", [arithmetic_row(1, 1)])
    base = dict(tasks_path=tasks, output_path=tmp_path / "o.jsonl", envs=["math"], model_url="http://x")
    assert CollectConfig(**base, concurrency=64, overrides={"max_output_tokens": 128}).timeout_s() == pytest.approx(879.2)
    assert CollectConfig(**base, concurrency=64, overrides={"max_tokens": 128}).timeout_s() == pytest.approx(879.2)
    assert CollectConfig(**base, concurrency=64, request_timeout=5.0).timeout_s() == 5.0
    policy = CollectConfig(**base, concurrency=64, overrides={"max_output_tokens": 128}).retry_policy()
    assert policy.request_timeout == pytest.approx(879.2) and policy.retry_timeouts is False
    with pytest.raises(CollectError, match="--request-timeout"):
        collect(CollectConfig(**base, request_timeout=0.0))


def test_the_summary_shows_retries_and_the_timeout(tmp_path, boxed_env):
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(1, 1), arithmetic_row(2, 2)])
    out = tmp_path / "r.jsonl"
    with FakeModel({"1 + 1": flaky(Fault.http(429, retry_after=0.01), times=2)}) as model:
        result = CliRunner().invoke(
            app,
            ["collect", str(tasks), "-o", str(out), "--env", boxed_env[0], "--model-url", model.url,
             "--concurrency", "8", "--max-output-tokens", "100", "--no-progress"],
            env={"COLUMNS": "200"},
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in result.output.splitlines() if "│" in line]
    lines = dict(cells)
    assert lines["retries (requests sent again)"] == "2"
    # 60 + 8 x 100 / 10 = 140, raised to the 300 s floor; the row says what it was sized for (issue 35)
    assert lines["request timeout per attempt (s, sized for 8 in flight x 100 tokens)"] == "300"
    assert json.loads((tmp_path / "r_metrics.json").read_text())["run"]["retries"] == 2


def test_piped_summary_shows_the_timeout_as_set_and_no_line_is_cut(tmp_path, boxed_env):
    """The real command, its output piped (no terminal, no $COLUMNS): rich cut lines at 80 columns
    mid-phrase, and a bare "request timeout (s) 1698" read as a budget nobody had set (issue 35)."""
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(1, 1), arithmetic_row(2, 2)])
    out = tmp_path / "rollouts_of_a_run_whose_name_is_long_enough_to_run_past_eighty_columns.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    with FakeModel({}) as model:
        proc = subprocess.run(
            [sys.executable, "-m", "gym_bridge.cli", "collect", str(tasks), "-o", str(out), "--env", boxed_env[0],
             "--model-url", model.url, "--request-timeout", "45"],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert f"rollouts: {out}" in lines  # one line, however long
    [row] = [line for line in lines if "request timeout per attempt" in line]
    assert [c.strip() for c in row.split("│")[1:-1]] == ["request timeout per attempt (s, --request-timeout)", "45"]
    widths = {len(line) for line in lines if line.startswith("│")}
    assert len(widths) == 1  # every row of the table is one line of the same width: no cell wrapped
