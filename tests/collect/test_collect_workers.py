"""``collect --workers N``: the rollouts run in N worker processes, this process writes the files.

Real processes throughout: the CLI as a child, its worker processes (each serving ``--env math`` in-process
on its own loop), the fake model over loopback HTTP. What must hold: the workers do run the rollouts (each
one's count in the metrics file, the same files as one process writes), a SIGKILL of the whole run and a
``--resume`` give every (task, repeat) exactly once, a worker dying mid-run stops the run non-zero with
the rollouts written so far kept, and bad values are refused naming ``--workers``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from collect_helpers import assert_written_exactly_once, read_jsonl, write_rows
from collect_helpers import rollout_pairs as pairs
from fake_model import FakeModel, Fault, arithmetic_row

from gym_bridge.collect import (
    CollectConfig,
    CollectError,
    aggregate_metrics_path_for,
    collect,
    failures_path_for,
    materialized_path_for,
    metrics_path_for,
)
from gym_bridge.collect.local_shards import WORKER_MODULE

REPO = str(Path(__file__).resolve().parents[2])
_FRESH = re.compile(r'"created_at":[0-9.e+-]+|"(?:resp|msg|fc|call)_fake_[0-9]+"')
"""What the fake model makes anew for every answer: its timestamp and its ids."""
_TIMINGS = ("elapsed_s", "rollouts_per_s", "time_to_first_rollout_s", "model_latency_s", "rollout_latency_s")


def _normalized_lines(path: Path) -> list[str]:
    return sorted(_FRESH.sub("_", line) for line in path.read_text().splitlines())


def _command(tasks: Path, out: Path, url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gym_bridge.cli", "collect", str(tasks), "-o", str(out), "--env", "math",
            "--model-url", url, "--no-progress", *extra]  # fmt: skip


def _worker_pids(parent: int, count: int, timeout: float = 30) -> list[int]:
    """The pids of ``parent``'s worker processes, once ``count`` of them run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [p.pid for p in psutil.Process(parent).children() if WORKER_MODULE in " ".join(p.cmdline())]
        if len(found) == count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{count} worker processes did not start")


def _wait_for_lines(out: Path, proc: subprocess.Popen, lines: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not out.exists() or out.read_bytes().count(b"\n") < lines:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run wrote too few rollouts"
        time.sleep(0.02)


def test_workers_run_the_rollouts_and_write_what_one_process_writes(tmp_path):
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(i % 10, i // 10) for i in range(40)])
    outs = {n: tmp_path / f"w{n}.jsonl" for n in (1, 2)}
    with FakeModel({"What is 3 + 0": Fault.http(500)}, record_requests=False) as model:  # task 3 fails
        for n, out in outs.items():
            config = CollectConfig(tasks, out, ["math"], model_url=model.url, num_repeats=3, concurrency=8, seed=7,
                                   workers=n, max_retries=0, progress=False)  # fmt: skip
            result = collect(config)
            assert (result.written, result.failed) == (117, 3)
    run = json.loads(metrics_path_for(outs[2]).read_text())["run"]
    processes = run["worker_processes"]
    assert run["workers"] == 2 and [p["worker"] for p in processes] == [0, 1]
    assert len({p["pid"] for p in processes} | {os.getpid()}) == 3  # two processes, neither this one
    assert all(p["rollouts"] > 0 for p in processes)
    assert sum(p["rollouts"] for p in processes) == 117 and sum(p["failed"] for p in processes) == 3
    assert "workers" not in json.loads(metrics_path_for(outs[1]).read_text())["run"]
    # The same files as one process writes (line order is completion order; the fake model's ids are fresh).
    assert _normalized_lines(outs[2]) == _normalized_lines(outs[1])
    assert _normalized_lines(failures_path_for(outs[2])) == _normalized_lines(failures_path_for(outs[1]))
    assert {f["_ng_task_index"] for f in read_jsonl(failures_path_for(outs[2]))} == {3}
    for side in (materialized_path_for, aggregate_metrics_path_for):
        assert side(outs[2]).read_text() == side(outs[1]).read_text()
    metrics = [json.loads(metrics_path_for(out).read_text()) for out in outs.values()]
    for m in metrics:
        for key in (*_TIMINGS, "workers", "worker_processes"):
            m["run"].pop(key, None)
    assert metrics[0] == metrics[1]
    assert metrics[0]["mean_reward"] == 1.0 and metrics[0]["num_rollouts"] == 117
    assert metrics[0]["run"]["failures_by_class"] == {"model_http_error": 3}
    assert all(r["reward"] == 1.0 for r in read_jsonl(outs[2]))


def test_sigkill_mid_run_then_resume_gives_every_rollout_exactly_once(tmp_path):
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(i % 10, i // 10) for i in range(40)])
    out = tmp_path / "rollouts.jsonl"
    with FakeModel(latency=0.05, record_requests=False) as model:
        command = _command(tasks, out, model.url, "--num-repeats", "3", "--concurrency", "4", "--workers", "2")
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            workers = [psutil.Process(pid) for pid in _worker_pids(proc.pid, 2)]
            _wait_for_lines(out, proc, 10)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.communicate()
        assert proc.returncode == -signal.SIGKILL
        _, alive = psutil.wait_procs(workers, timeout=15)
        assert alive == [], "worker processes outlived their parent's SIGKILL"
        done_before = pairs(out)
        assert 10 <= len(done_before) < 120

        resumed = subprocess.run(command + ["--resume"], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 0, resumed.stderr
    assert_written_exactly_once(out, 40, 3, done_before)
    assert all(r["reward"] == 1.0 for r in read_jsonl(out))
    run = json.loads(metrics_path_for(out).read_text())["run"]
    assert run["already_done"] == len(done_before) and run["rollouts_written"] == 120 - len(done_before)


def test_a_worker_dying_mid_run_stops_the_run_and_keeps_what_was_written(tmp_path):
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(i % 10, i // 10) for i in range(60)])
    out = tmp_path / "rollouts.jsonl"
    with FakeModel(latency=0.05, record_requests=False) as model:
        command = _command(tasks, out, model.url, "--num-repeats", "2", "--concurrency", "4", "--workers", "2")
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            victim = _worker_pids(proc.pid, 2)[1]
            _wait_for_lines(out, proc, 6)
            written_before = out.read_bytes().count(b"\n")
            os.kill(victim, signal.SIGKILL)
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            proc.kill()
        said = " ".join((stdout + stderr).split())
        assert proc.returncode != 0, said
        assert f"worker process 1 (pid {victim}) was killed by SIGKILL mid-run" in said
        assert "rerun with --resume" in said
        kept = pairs(out)  # every line whole (read_jsonl parses each), none twice
        assert written_before <= len(kept) < 120 and len(set(kept)) == len(kept)

        resumed = subprocess.run(command + ["--resume"], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 0, resumed.stderr
    assert sorted(pairs(out)) == [(t, r) for t in range(60) for r in range(2)]
    assert not failures_path_for(out).exists() or read_jsonl(failures_path_for(out)) == []


def test_bad_workers_values_are_refused_naming_the_flag(tmp_path):
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(1, 2)])
    for bad in (0, -3):
        with pytest.raises(CollectError, match="--workers"):
            collect(CollectConfig(tasks, tmp_path / "r.jsonl", ["math"], model_url="http://127.0.0.1:9/v1",
                                  workers=bad, progress=False))  # fmt: skip
    for extra in (["--workers", "0"], ["--workers", "two"], ["--workers", "2", "--ray"]):
        done = subprocess.run(_command(tasks, tmp_path / "r.jsonl", "http://127.0.0.1:9/v1", *extra), cwd=REPO,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 2, (extra, done.stdout, done.stderr)
        assert "--workers" in done.stdout + done.stderr, extra
    assert not (tmp_path / "r.jsonl").exists()


def test_more_workers_than_rollouts_in_flight_start_only_as_many_and_say_so(tmp_path):
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(i, 1) for i in range(6)])
    said: list[str] = []
    with FakeModel(record_requests=False) as model:
        result = collect(CollectConfig(tasks, tmp_path / "r.jsonl", ["math"], model_url=model.url, concurrency=2,
                                       workers=4, progress=False), report=said.append)  # fmt: skip
    assert (result.written, result.failed) == (6, 0)
    run = result.metrics["run"]
    assert run["workers"] == 2 and len(run["worker_processes"]) == 2
    assert any("--workers 4 with --concurrency 2: starting 2 worker process" in m for m in said), said
