"""Envs that collect starts itself (``--env math``, ``--env module:Class``) are called in-process: no
server, no socket, and the same files as over loopback HTTP (``--env-transport http``)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from collect_helpers import note_taker, notes_row, read_jsonl, write_rows
from fake_model import FakeModel, arithmetic_row, function_call, solve_arithmetic, tool_outputs
from typer.testing import CliRunner

import gym_bridge.serving.uvicorn_thread
from gym_bridge.collect import (
    CollectConfig,
    CollectError,
    aggregate_metrics_path_for,
    collect,
    failures_path_for,
    materialized_path_for,
    metrics_path_for,
)
from gym_bridge.collect.config import ENV_TRANSPORTS
from gym_bridge.commands.collect import EnvTransportChoice

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
ENVS = ["math", "notes=collect_helpers:NotesEnv", "faulty=collect_helpers:FaultyEnv"]
"""One built-in env and two of ``module:Class``: every kind collect starts itself."""


def _rows() -> list[dict[str, Any]]:
    """Rows for each env: right and wrong answers, tool calls with session state, and every fault."""
    return [
        arithmetic_row(2, 3, env="math"),
        arithmetic_row(4, 4, env="math"),
        notes_row(["a", "b"], env="notes"),
        notes_row(["boom"], env="notes"),  # the env's ``explode`` tool: a 500, not sent again (it may have run)
        arithmetic_row(1, 1, env="faulty"),
        arithmetic_row(1, 2, env="faulty", fault="seed_4xx"),
        arithmetic_row(1, 3, env="faulty", fault="verify_raises"),
        arithmetic_row(1, 4, env="faulty", fault="verify_4xx"),
    ]


def _script(request: dict[str, Any], n: int) -> Any:
    text = json.dumps(request)
    if "take notes: boom" in text:
        return [function_call("explode", {"text": "x"})] if not tool_outputs(request) else "gave up"
    if "take notes" in text:
        return note_taker(request, n)
    if "4 + 4" in text:
        return "\\boxed{9}"
    return solve_arithmetic(request, n)


def _without_ids(value: Any) -> Any:
    """``value`` without what differs between any two runs (fresh ids, timestamps)."""
    if isinstance(value, dict):
        return {k: _without_ids(v) for k, v in value.items() if k not in ("id", "call_id", "created_at")}
    if isinstance(value, list):
        return [_without_ids(v) for v in value]
    return value


_ENV_URL = re.compile(r"http://(127\.0\.0\.1:\d+|[a-z0-9-]+\.in-process)")


def _keyed(path: Path) -> list[dict[str, Any]]:
    """The file's records in (task, repeat) order, env URLs in messages made alike."""
    records = read_jsonl(path) if path.exists() else []
    records = json.loads(_ENV_URL.sub("<env>", json.dumps(records)))
    return sorted(records, key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))


@pytest.fixture
def server_starts(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The apps served on a loopback port (``start_in_thread``) from now on: the envs collect serves over HTTP."""
    started: list[Any] = []
    real_start = gym_bridge.serving.uvicorn_thread.start_in_thread

    def start(app: Any, **kw: Any) -> Any:
        started.append(app)
        return real_start(app, **kw)

    monkeypatch.setattr(gym_bridge.serving.uvicorn_thread, "start_in_thread", start)
    return started


def _run(tmp_path: Path, transport: str) -> dict[str, Any]:
    """What one collection over every env writes (a fresh fake model, started before the run)."""
    out = tmp_path / transport / "r.jsonl"
    out.parent.mkdir()
    tasks = write_rows(tmp_path / f"tasks_{transport}.jsonl", _rows())
    with FakeModel(_script) as model:
        config = CollectConfig(tasks, out, list(ENVS), model_url=model.url, num_repeats=2, concurrency=4,
                               progress=False, max_retries=1, env_transport=transport)  # fmt: skip
        result = collect(config, report=lambda message: None)
    metrics = json.loads(metrics_path_for(out).read_text())
    run = metrics.pop("run")
    counted = ("rollouts_written", "rollouts_failed", "failures_by_class", "model_calls", "tool_calls", "retries",
               "input_tokens", "output_tokens")  # fmt: skip
    written = {
        "records": [_without_ids(r) for r in _keyed(out)],
        "failures": _keyed(failures_path_for(out)),
        "materialized": _keyed(materialized_path_for(out)),
        "metrics": metrics,
        "run": {k: run[k] for k in counted},
        # One entry per env, in the order the envs first wrote a record (the run's timing): compared by env.
        "aggregate": sorted(json.loads(aggregate_metrics_path_for(out).read_text()),
                            key=lambda entry: entry["_ng_environment_server"]),
        "result": (result.written, result.failed),
    }
    return written


@pytest.mark.timeout(180)
def test_self_started_envs_are_called_in_process_and_write_what_http_writes(tmp_path, server_starts):
    in_process = _run(tmp_path, "in-process")
    assert server_starts == []  # in-process: no server, no socket
    over_http = _run(tmp_path, "http")
    assert len(server_starts) == len(ENVS)
    assert in_process == over_http
    # What the comparison covers: rewards, tool calls with per-rollout sessions, and each kind of failure.
    assert [(r["_ng_task_index"], r["reward"]) for r in in_process["records"]] == [
        (0, 1.0), (0, 1.0), (1, 0.0), (1, 0.0), (2, 1.0), (2, 1.0), (4, 1.0), (4, 1.0),
    ]  # fmt: skip
    assert in_process["records"][4]["session_notes"] == ["a", "b"]
    failures = {
        (f["_ng_task_index"], f["stage"], f["_ng_failure_class"], f["attempts"])
        for f in in_process["failures"]
    }
    assert failures == {
        (3, "tool", "env_http_error", 1),  # the tool's 500: a tool call that may have run is not sent again
        (5, "seed_session", "env_http_error", 1),  # 409 at session set-up: not retried
        (6, "verify", "env_http_error", 2),  # the verifier raised: a 500
        (7, "verify", "env_http_error", 1),  # 400
    }
    errors = {f["_ng_task_index"]: f["error"] for f in in_process["failures"]}
    assert "<env>/seed_session answered HTTP 409" in errors[5] and "no session for this row" in errors[5]
    assert "<env>/verify answered HTTP 400" in errors[7] and "cannot verify this row" in errors[7]
    assert {a["_ng_environment_server"] for a in in_process["aggregate"]} == {
        "math_environment_server", "notes_environment_server", "faulty_environment_server",
    }  # fmt: skip


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("flag", "servers"), [([], 0), (["--env-transport", "in-process"], 0), (["--env-transport", "http"], 1)]
)
def test_env_transport_flag_decides_whether_a_server_is_started(tmp_path, server_starts, flag, servers):
    import gym_bridge.cli

    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(2, 3), arithmetic_row(1, 1)])
    out = tmp_path / "r.jsonl"
    with FakeModel() as model:
        args = [
            "collect",
            str(tasks),
            "-o",
            str(out),
            "--env",
            "math",
            "--model-url",
            model.url,
            "--no-progress",
            *flag,
        ]
        result = CliRunner().invoke(gym_bridge.cli.app, args)
    assert result.exit_code == 0, result.output
    assert len(server_starts) == servers
    assert [r["reward"] for r in read_jsonl(out)] == [1.0, 1.0]
    assert len(json.loads(aggregate_metrics_path_for(out).read_text())) == 1  # /aggregate_metrics reached it


def test_env_transport_flag_refuses_other_values_and_matches_the_config(tmp_path):
    import gym_bridge.cli

    assert [c.value for c in EnvTransportChoice] == list(ENV_TRANSPORTS)
    result = CliRunner().invoke(gym_bridge.cli.app, ["collect", "t.jsonl", "-o", "o.jsonl", "--env", "math",
                                                     "--model-url", "http://x", "--env-transport", "socket"])  # fmt: skip
    assert result.exit_code == 2 and "socket" in result.output
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(2, 3)])
    config = CollectConfig(
        tasks, tmp_path / "o.jsonl", ["math"], model_url="http://x", env_transport="socket"
    )  # type: ignore[arg-type]
    with pytest.raises(CollectError, match="--env-transport must be one of in-process, http"):
        collect(config)


def test_an_env_that_does_not_start_in_process_is_named(tmp_path):
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(2, 3)])
    config = CollectConfig(tasks, tmp_path / "o.jsonl", ["collect_helpers:BrokenStartEnv"], model_url="http://x",
                           progress=False)  # fmt: skip
    with pytest.raises(
        CollectError, match=r"env 'collect_helpers:BrokenStartEnv' did not start: .*no sandbox here"
    ):
        collect(config)


@pytest.mark.timeout(120)
def test_ctrl_c_still_shuts_the_in_process_envs_down(tmp_path):
    """SIGINT mid-run: exit 130 with complete lines only, and the env's lifespan shut-down ran. More rows
    than the job queue holds, so the producer is waiting on a full queue when it is cancelled."""
    rows = [arithmetic_row(i % 10, i // 10, env=("math", "boxed")[i % 2]) for i in range(400)]
    tasks = write_rows(tmp_path / "tasks.jsonl", rows)
    out, mark = tmp_path / "r.jsonl", tmp_path / "shutdown.mark"
    env = {
        **os.environ,
        "SHUTDOWN_MARK": str(mark),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), str(REPO)]),
    }
    with FakeModel(record_requests=False) as model:
        command = [sys.executable, "-m", "gym_bridge.cli", "collect", str(tasks), "-o", str(out), "--env",
                   "math", "--env", "boxed=collect_helpers:ShutdownMarkEnv", "--model-url", model.url,
                   "--concurrency", "4", "--no-progress"]  # fmt: skip
        proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 60
        while (not out.exists() or out.read_text().count("\n") < 3) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "rerun with --resume" in " ".join(stderr.split())
    assert mark.read_text() == "down"
    assert out.read_text().endswith("\n") and 3 <= len(read_jsonl(out)) < 400
