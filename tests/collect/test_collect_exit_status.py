"""A collection that did not do its job exits non-zero, saying why on the console (issue 37).

Real processes: ``gym-bridge collect`` as a subprocess, the built-in math env, and either nothing
listening at ``--model-url`` (a loopback port just closed) or tests/fake_model.py failing some tasks.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from collect_helpers import read_jsonl, write_rows
from collect_helpers import rollout_pairs as pairs
from fake_model import FakeModel, Fault, arithmetic_row

from gym_bridge.collect import failures_path_for

REPO = Path(__file__).resolve().parents[2]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_collect(tasks: Path, out: Path, model_url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "gym_bridge.cli", "collect", str(tasks), "-o", str(out), "--env", "math",
        "--model-url", model_url, "--no-progress", "--max-retries", "0", *extra,
    ]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


def test_nothing_succeeded_exits_1_naming_the_cause_and_keeps_the_files(tmp_path):
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(i, 1) for i in range(4)])
    out = tmp_path / "rollouts.jsonl"
    port = closed_port()
    done = run_collect(tasks, out, f"http://127.0.0.1:{port}/v1")
    console = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, console
    assert "no rollout succeeded (4 failed)" in console, console
    # the cause itself, once (four identical failures), not only its class
    assert "failure cause (model_connection_error, 4x): " in console, console
    assert f"127.0.0.1:{port}" in console.split("failure cause", 1)[1], console
    assert "Traceback" not in console
    failures = read_jsonl(failures_path_for(out))
    assert sorted(f["_ng_task_index"] for f in failures) == [0, 1, 2, 3]


def test_max_failed_fraction_sets_the_threshold_and_the_good_rollouts_stay(tmp_path):
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(i, 1) for i in range(4)])
    with FakeModel({"What is 2 + 1": Fault.http(500)}, record_requests=False) as model:
        out = tmp_path / "a.jsonl"  # 1 of 4 failed: 25% is above 0.2
        strict = run_collect(tasks, out, model.url, "--max-failed-fraction", "0.2")
        text = " ".join((strict.stdout + strict.stderr).split())
        assert strict.returncode == 1, text
        assert "1 of 4 rollouts failed (25.0%), more than --max-failed-fraction 0.2" in text, text
        assert "failure cause (model_http_error, 1x): " in text and "fake error 500" in text, text
        assert sorted(pairs(out)) == [(0, 0), (1, 0), (3, 0)]  # the finished rollouts are kept

        lenient = run_collect(tasks, tmp_path / "b.jsonl", model.url, "--max-failed-fraction", "0.5")
        text = " ".join((lenient.stdout + lenient.stderr).split())
        assert lenient.returncode == 0, text
        assert "failure cause (model_http_error, 1x): " in text, text  # said, though the run passes

        default = run_collect(tasks, tmp_path / "c.jsonl", model.url)  # default: only "nothing succeeded" fails
        assert default.returncode == 0, default.stderr

    refused = run_collect(tasks, tmp_path / "d.jsonl", "http://127.0.0.1:9/v1", "--max-failed-fraction", "1.5")
    assert refused.returncode == 2 and "--max-failed-fraction" in refused.stderr, refused.stderr
