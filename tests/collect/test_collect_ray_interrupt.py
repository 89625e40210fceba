"""Ctrl-C of ``gym-bridge collect --ray``: exit 130, a whole output file that ``--resume`` finishes, and
nothing of the run left running.

The run is a child process with a private Ray on 127.0.0.1 (bare ``--ray``), in its own process group,
which gets SIGINT as a terminal's Ctrl-C sends it: to the whole foreground group. Every process of the
run (the driver, Ray's GCS, raylet and workers, the shard's env server and its verifier pool) carries
a marker in its environment, so what is left afterwards is found whoever its parent became.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from collect_helpers import rollout_pairs, write_rows
from fake_model import FakeModel, arithmetic_row

from tests.ray_loopback import RUN_MARK, listeners, marked, off_loopback, ray_processes
from tests.reliability.procs import child_env, kill9, start

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

MARK = RUN_MARK


def watch(proc: Any, out: Path, lines: int, timeout: float = 180) -> tuple[dict[int, str], list[Any]]:
    """Until ``out`` has ``lines`` lines: every process of the run's tree seen (pid -> name), and its
    listening sockets at the end."""
    seen: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    root = psutil.Process(proc.pid)
    while not out.exists() or out.read_text().count("\n") < lines:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{out} did not reach {lines} lines"
        for process in ray_processes(root):
            try:
                seen[process.pid] = process.name()
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.05)
    return seen, listeners(root)


def left_running(mark: str, seen: dict[int, str], timeout: float = 30) -> dict[int, str]:
    """The run's processes still alive after ``timeout`` s (by marker, or by pid among those seen)."""
    deadline = time.monotonic() + timeout
    while True:
        left = {**{p: n for p, n in seen.items() if _alive(p, n)}, **marked(mark)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _alive(pid: int, name: str) -> bool:
    try:
        process = psutil.Process(pid)
        return process.name() == name and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(400)
def test_ctrl_c_of_collect_ray_exits_130_with_a_whole_file_that_resume_finishes_and_nothing_left(
    tmp_path: Path,
) -> None:
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(i, 2) for i in range(30)])
    out = tmp_path / "rollouts.jsonl"
    mark = uuid.uuid4().hex
    ray_tmp = tempfile.mkdtemp(prefix="gbr-", dir="/tmp")  # short: Ray's unix socket paths live in it
    env = child_env(**{MARK: mark, "RAY_TMPDIR": ray_tmp, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    env.pop("RAY_ADDRESS", None)  # bare --ray: a private Ray of the run's own
    procs = []
    try:
        with FakeModel(latency=0.05, record_requests=False) as model:
            command = [
                sys.executable, "-m", "gym_bridge.cli", "collect", str(tasks), "-o", str(out), "--env", "math",
                "--model-url", model.url, "--num-repeats", "2", "--concurrency", "2", "--no-progress", "--ray",
            ]  # fmt: skip
            procs.append(start(command, env=env))
            seen, found = watch(procs[0], out, lines=8)
            during = marked(mark)
            os.killpg(procs[0].pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole process group
            _, stderr = procs[0].communicate(timeout=120)
            assert procs[0].returncode == 130, stderr
            assert "rerun with --resume" in " ".join(stderr.split())
            assert left_running(mark, seen) == {}

            text = out.read_text()
            assert text.endswith("\n")
            records = [json.loads(line) for line in text.splitlines()]  # every line whole JSON
            done_before = rollout_pairs(out)
            assert 8 <= len(records) < 60 and len(set(done_before)) == len(done_before)

            procs.append(start(command + ["--resume"], env=env))
            _, stderr = procs[1].communicate(timeout=240)
            assert procs[1].returncode == 0, stderr
            assert left_running(mark, {}) == {}
    finally:
        for proc in procs:
            kill9(proc)
        shutil.rmtree(ray_tmp, ignore_errors=True)

    # The run's tree was what the marker finds: Ray's own processes, the shard, its env server's pool.
    kinds = {"raylet": "raylet", "gcs_server": "gcs_server", "ray::CollectShard": "shard"}  # a shard: ray::CollectShard.run
    ray_side = {pid: kind for pid, name in seen.items() for prefix, kind in kinds.items() if name.startswith(prefix)}
    assert set(ray_side.values()) == {"raylet", "gcs_server", "shard"}, sorted(set(seen.values()))
    assert set(ray_side) <= set(during), (ray_side, during)  # the marker finds the run's processes
    assert off_loopback(found) == [], f"sockets bound off loopback: {off_loopback(found)}"

    everything = rollout_pairs(out)
    assert Counter(everything).most_common(1)[0][1] == 1  # each (task, repeat) exactly once
    assert sorted(everything) == [(t, r) for t in range(30) for r in range(2)]
    assert everything[: len(done_before)] == done_before  # the lines before Ctrl-C kept as they were

