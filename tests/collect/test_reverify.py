"""``gym-bridge reverify``: stored rollouts re-scored by the current verifier, by the real CLI against real servers.

The stored file is a real collect run (math server, scripted model) whose rewards are then altered, as an
older verifier would have left them; re-verifying must find exactly those.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from collect_helpers import read_jsonl, write_rows
from fake_model import FakeModel, arithmetic_row, solve_arithmetic

from gym_bridge.collect import CollectConfig, aggregate_metrics_path_for, collect, failures_path_for
from gym_bridge.collect.config import CollectError
from gym_bridge.collect.reverify import ReverifyConfig, reverify

REPO = Path(__file__).resolve().parents[2]
FLIPPED_RIGHT = {(0, 1), (3, 1)}  # two right rollouts stored as wrong; the one wrong rollout is stored as right


def one_wrong(request, n):
    if "4 + 4" in json.dumps(request) and n == 1:
        return "I think the answer is \\boxed{9}."
    return solve_arithmetic(request, n)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """(stored file with the flipped rewards altered, the rewards the verifier gives, the flipped keys).

    Which repeat of "4 + 4" gets the wrong answer depends on the order the model sees them in, so the
    wrong one is found from the collected rewards."""
    tmp = tmp_path_factory.mktemp("reverify")
    rows = [arithmetic_row(2, 3), arithmetic_row(4, 4), arithmetic_row(1, 0), arithmetic_row(6, 1)]
    tasks = write_rows(tmp / "tasks.jsonl", rows)
    with FakeModel(one_wrong) as model:
        result = collect(
            CollectConfig(tasks, tmp / "collected.jsonl", ["math"], model_url=model.url, num_repeats=2, progress=False)
        )
    records = read_jsonl(result.output_path)
    truth = {(r["_ng_task_index"], r["_ng_rollout_index"]): r["reward"] for r in records}
    assert sorted(truth.values()) == [0.0] + [1.0] * 7
    flipped = FLIPPED_RIGHT | {key for key, reward in truth.items() if reward == 0.0}
    for r in records:
        if (r["_ng_task_index"], r["_ng_rollout_index"]) in flipped:
            r["reward"] = 1.0 - r["reward"]
            r["failure_kind"] = "stale"
    path = tmp / "stored.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path, truth, flipped


def cli(*args, check_rc=None):
    done = subprocess.run(
        [sys.executable, "-m", "gym_bridge.cli", "reverify", *map(str, args)],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    if check_rc is not None:
        assert done.returncode == check_rc, done.stdout + done.stderr
    return done


def test_reverify_rescores_and_reports_the_changes(stored, tmp_path):
    path, truth, flipped = stored
    out = tmp_path / "re.jsonl"
    done = cli(path, "-o", out, "--env", "math", "--concurrency", "3", check_rc=0)
    assert "re-verified 8 rollouts (8 this run, 0 already done): 3 rewards changed (2 up, 1 down)" in done.stdout
    shown = set(re.findall(r"task (\d+) repeat (\d+): reward", done.stdout))
    assert {(int(t), int(r)) for t, r in shown} == flipped
    new = read_jsonl(out)
    assert {(r["_ng_task_index"], r["_ng_rollout_index"]): r["reward"] for r in new} == truth
    old = {(r["_ng_task_index"], r["_ng_rollout_index"]): r for r in read_jsonl(path)}
    for record in new:
        before = old[(record["_ng_task_index"], record["_ng_rollout_index"])]
        assert record.get("failure_kind") != "stale"  # the old verdict is not sent back
        for key in ("agent_ref", "_ng_environment_server", "_ng_result_type", "response", "expected_answer"):
            assert record[key] == before[key], key
    aggregate = json.loads(aggregate_metrics_path_for(out).read_text())
    assert aggregate[0]["_ng_environment_server"] == "math_environment_server"
    assert aggregate[0]["agent_metrics"]["mean/reward"] == pytest.approx(7 / 8)
    assert not failures_path_for(out).exists()


def test_reverify_resumes_after_a_crash_and_still_counts_every_change(stored, tmp_path):
    path, truth, flipped = stored
    out = tmp_path / "re.jsonl"
    cli(path, "-o", out, "--env", "math", "--concurrency", "1", check_rc=0)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:3]) + lines[3][:25])  # 3 kept, one torn
    refused = cli(path, "-o", out, "--env", "math", check_rc=2)
    assert "--resume" in refused.stderr
    done = cli(path, "-o", out, "--env", "math", "--resume", check_rc=0)
    assert "re-verified 8 rollouts (5 this run, 3 already done): 3 rewards changed" in done.stdout
    new = read_jsonl(out)
    assert len(new) == 8
    assert {(r["_ng_task_index"], r["_ng_rollout_index"]): r["reward"] for r in new} == truth


def test_unusable_lines_are_named_and_skipped_or_stop_with_strict(stored, tmp_path):
    path, _, _ = stored
    lines = path.read_text().splitlines()
    no_index = json.loads(lines[1])
    del no_index["_ng_task_index"]
    dirty = tmp_path / "dirty.jsonl"
    dirty.write_text("\n".join([lines[0], "{not json", json.dumps(no_index), '{"reward": 1}', *lines[2:]]) + "\n")
    out = tmp_path / "re.jsonl"
    done = cli(dirty, "-o", out, "--env", "math", check_rc=0)
    assert f"{dirty}:2: invalid JSON" in done.stderr
    assert f"{dirty}:3: no _ng_task_index/_ng_rollout_index" in done.stderr
    assert f"{dirty}:4: not a rollout: no 'response'" in done.stderr
    assert "re-verified 7 rollouts" in done.stdout and "3 stored lines skipped" in done.stdout
    strict = cli(dirty, "-o", tmp_path / "strict.jsonl", "--env", "math", "--strict", check_rc=2)
    assert f"{dirty}:2: invalid JSON" in strict.stderr
    assert not (tmp_path / "strict.jsonl").exists()


def test_a_verifier_that_refuses_a_rollout_sends_it_to_the_failures_file(stored, tmp_path):
    path, _, _ = stored
    records = read_jsonl(path)
    broken_key = (records[0]["_ng_task_index"], records[0]["_ng_rollout_index"])  # collect writes in completion order
    del records[0]["expected_answer"]
    broken = tmp_path / "broken.jsonl"
    broken.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "re.jsonl"
    done = cli(broken, "-o", out, "--env", "math", check_rc=1)
    assert "1 failed" in done.stdout
    assert len(read_jsonl(out)) == 7
    (failure,) = read_jsonl(failures_path_for(out))
    assert (failure["_ng_task_index"], failure["_ng_rollout_index"]) == broken_key
    assert failure["_ng_failure_class"].startswith("env_") and "expected_answer" in failure["error"]


def test_reverify_against_a_url(stored, tmp_path):
    from gym_bridge.rollout.envs import running_env

    path, truth, flipped = stored
    out = tmp_path / "re.jsonl"
    with running_env("math") as url:
        done = cli(path, "-o", out, "--env", url, check_rc=0)
    assert "3 rewards changed" in done.stdout
    assert {(r["_ng_task_index"], r["_ng_rollout_index"]): r["reward"] for r in read_jsonl(out)} == truth


def test_reverify_sends_the_env_api_key_to_a_server_with_a_token(stored, tmp_path):
    """A server started with ``--token`` answers 401 without it (every rollout fails: exit 1);
    ``--env-api-key`` sends it."""
    from gym_bridge.rollout.envs import running_env

    path, truth, _ = stored
    with running_env("math", auth_token="env-sekrit") as url:
        refused = cli(path, "-o", tmp_path / "no.jsonl", "--env", url, "--max-retries", "0", check_rc=1)
        cli(path, "-o", tmp_path / "ok.jsonl", "--env", url, "--env-api-key", "env-sekrit", check_rc=0)
    assert "8 failed" in refused.stdout, refused.stdout
    assert "401" in (tmp_path / "no_failures.jsonl").read_text()
    assert {(r["_ng_task_index"], r["_ng_rollout_index"]): r["reward"] for r in read_jsonl(tmp_path / "ok.jsonl")} == truth


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("concurrency", 0, "--concurrency must be at least 1"),
        ("limit", -1, "--limit must not be negative"),
        ("max_retries", -1, "--max-retries must not be negative"),
    ],
)
def test_reverify_refuses_the_run_options_collect_refuses(stored, tmp_path, option, value, message):
    # collect and reverify share these options (RunOptions) and their checks: a negative --limit used to
    # re-verify nothing and call it a success, a negative --max-retries to crash in RetryPolicy (a traceback)
    path, _, _ = stored
    out = tmp_path / "re.jsonl"
    with pytest.raises(CollectError, match=re.escape(message)):
        reverify(ReverifyConfig(rollouts_path=path, output_path=out, env="math", **{option: value}))
    assert not out.exists()
