"""Nothing lost: after a crash (even SIGKILL) --resume makes exactly the missing rollouts, no duplicates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from collect_helpers import assert_written_exactly_once, read_jsonl, sigkill_after_lines, write_rows
from collect_helpers import rollout_pairs as pairs
from fake_model import FakeModel, Fault, arithmetic_row

from gym_bridge.collect import CollectConfig, collect, failures_path_for, metrics_path_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_resume_fills_gaps_repairs_torn_tail_and_retries_failures(tmp_path, boxed_env):
    rows = [arithmetic_row(i, 1) for i in range(6)]
    tasks = write_rows(tmp_path / "tasks.jsonl", rows)
    out = tmp_path / "rollouts.jsonl"

    def config(**kw):
        return CollectConfig(tasks, out, [boxed_env[0]], model_url=model.url, num_repeats=2, progress=False,
                             max_retries=0, **kw)  # fmt: skip

    with FakeModel({"What is 2 + 1": Fault.http(500)}) as model:  # task 2 fails in the first run
        first = collect(config())
    assert first.written == 10 and first.failed == 2
    assert {(f["_ng_task_index"], f["_ng_rollout_index"]) for f in read_jsonl(failures_path_for(out))} == {
        (2, 0),
        (2, 1),
    }

    # Simulate a crash: keep 6 complete lines, then a torn one.
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:6]) + lines[6][: len(lines[6]) // 2])
    kept = set(pairs_of(lines[:6]))

    messages: list[str] = []
    with FakeModel() as model:
        second = collect(config(resume=True), report=messages.append)
        asked = model.calls.total()
    assert any("torn last line" in m for m in messages)
    everything = pairs(out)
    assert sorted(everything) == [(t, r) for t in range(6) for r in range(2)]
    assert len(everything) == len(set(everything))
    assert asked == 12 - len(kept) == second.written
    assert second.already_done == 6
    assert [f["_ng_task_index"] for f in read_jsonl(failures_path_for(out))] == [2, 2]  # history is kept
    metrics = json.loads(metrics_path_for(out).read_text())
    assert metrics["num_rollouts"] == 12 and metrics["mean_reward"] == 1.0
    assert metrics["run"]["already_done"] == 6

    with FakeModel() as model:  # nothing left to do
        third = collect(config(resume=True))
        assert model.calls.total() == 0
    assert third.written == 0 and len(pairs(out)) == 12


def pairs_of(lines: list[str]) -> list[tuple[int, int]]:
    return [(json.loads(x)["_ng_task_index"], json.loads(x)["_ng_rollout_index"]) for x in lines]


def test_sigkill_then_resume_gives_every_rollout_exactly_once(tmp_path, boxed_env):
    rows = [arithmetic_row(i % 10, i // 10) for i in range(30)]
    tasks = write_rows(tmp_path / "tasks.jsonl", rows)
    out = tmp_path / "rollouts.jsonl"
    with FakeModel(latency=0.05, record_requests=False) as model:
        command = [
            sys.executable, "-m", "gym_bridge.cli", "collect", str(tasks), "-o", str(out),
            "--env", boxed_env[0], "--model-url", model.url, "--num-repeats", "3",
            "--concurrency", "4", "--no-progress",
        ]  # fmt: skip
        sigkill_after_lines(command, out, 10, cwd=REPO)
        done_before = pairs(out)
        assert 10 <= len(done_before) < 90
        with open(out, "a") as f:
            f.write('{"_ng_task_index": 29, "_ng_rollout_index": 2, "responses_create_params": {"inp')  # torn

        resumed = subprocess.run(
            command + ["--resume"], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert resumed.returncode == 0, resumed.stderr
    assert_written_exactly_once(out, 30, 3, done_before)
    assert all(r["reward"] == 1.0 for r in read_jsonl(out))
    assert "torn last line" in resumed.stderr


def test_fresh_run_replaces_stale_failures(tmp_path, boxed_env):
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(1, 1)])
    out = tmp_path / "rollouts.jsonl"
    failures_path_for(out).write_text('{"stale": true}\n')
    with FakeModel() as model:
        collect(CollectConfig(tasks, out, [boxed_env[0]], model_url=model.url, progress=False))
    assert not failures_path_for(out).exists()
    assert pairs(out) == [(0, 0)]


def test_ctrl_c_stops_cleanly_and_says_how_to_resume(tmp_path, boxed_env):
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(i, 1) for i in range(50)])
    out = tmp_path / "rollouts.jsonl"
    with FakeModel(latency=0.05, record_requests=False) as model:
        command = [sys.executable, "-m", "gym_bridge.cli", "collect", str(tasks), "-o", str(out), "--env",
                   boxed_env[0], "--model-url", model.url, "--concurrency", "2", "--no-progress"]  # fmt: skip
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while (not out.exists() or out.read_text().count("\n") < 3) and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "rerun with --resume" in " ".join(stderr.split())
    text = out.read_text()
    assert text.endswith("\n") and 3 <= len(read_jsonl(out)) < 50  # only complete lines
